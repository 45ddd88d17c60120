"""Priority classes and how they map onto Dagster's run queue.

`dagster/priority` orders the queue (higher first); the class itself travels as our own tag so the
run-queue headroom rules and the metrics can tell interactive work from background work.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum


class PriorityClass(StrEnum):
    INTERACTIVE = "interactive"  # a fresh lead in an active case: an investigator is waiting
    RECURRING = "recurring"  # a cadence re-crawl of monitored leads
    BACKFILL = "backfill"  # bulk work that must yield to everything else


# Wide gaps leave room for finer ordering inside a class. A backfill launched from the Dagster UI
# carries no priority tag (0), so it ranks with our own backfills, below recurring crawls.
DAGSTER_PRIORITY: dict[PriorityClass, int] = {
    PriorityClass.INTERACTIVE: 100,
    PriorityClass.RECURRING: 50,
    PriorityClass.BACKFILL: 0,
}

PRIORITY_CLASS_TAG = "investigations/priority_class"
# Set on recurring and backfill runs; dagster.yaml caps how many run at once, so the rest of the
# run slots stay free for interactive work.
BACKGROUND_TAG = "investigations/background"
# Unix niceness of a background run's worker: on a busy machine the CPU goes to a fresh lead's run
# first (a run start costs seconds of CPU); a batch waits on its rate lanes most of the time anyway.
BACKGROUND_NICENESS = 10
# Every run the dispatcher requests carries its handover key here. A batch run's members are the
# queue rows recorded under that key (its partition range is only the envelope around them), and a
# run that died gives those rows back by it.
HANDOVER_TAG = "investigations/handover"
# Every run of a case carries it, so the Runs page filtered by the case shows the case's runs.
CASE_TAG = "investigations/case"
# An interactive run that fresh leads of other cases joined names those cases here (see
# `investigations.collection.runwork`); its own case stays in CASE_TAG.
JOINED_CASES_TAG = "investigations/joined_cases"
# A dispatched batch runs its source's asset alone, without its check in the run's selection, and
# judges each lead in the step all the same (`assets.sources`): Dagster writes a planned row for a
# selected check per partition of the run's range, each holding the whole serialized range (some
# 40 KB for 1,000 leads: 40 MB and seconds of the daemon's time per batch run it creates). Set on
# such runs; a run launched from the UI without the check is not judged.
CHECKS_IN_STEP_TAG = "investigations/checks_in_step"
# A run of several leads names them here, as investigators type them (`domain:example.com, ...`): the
# leads a dispatched batch or a UI backfill's run covers, cut to a run tag's length.
LEADS_TAG = "investigations/leads"


def run_tags(priority: PriorityClass) -> dict[str, str]:
    """The run tags that place a run of this class in Dagster's queue."""
    tags = {"dagster/priority": str(DAGSTER_PRIORITY[priority]), PRIORITY_CLASS_TAG: priority.value}
    if priority is not PriorityClass.INTERACTIVE:
        tags[BACKGROUND_TAG] = "true"
    return tags


def is_background(tags: Mapping[str, str]) -> bool:
    """Whether a run is background work: our recurring crawls and backfills, or a UI backfill."""
    return tags.get(BACKGROUND_TAG) == "true" or "dagster/backfill" in tags


def lower_cpu_priority_if_background(tags: Mapping[str, str]) -> None:
    """Give a background run's worker process BACKGROUND_NICENESS (idempotent: niceness is set, not
    added, and never lowered). The in-process executor runs the whole run in this one process, so
    only this run yields. The fleet's run launcher does it at the worker's fork, so a batch's start
    is niced too (`resources.run_launcher`); the asset does it again for runs another launcher starts."""
    if is_background(tags) and hasattr(os, "setpriority"):
        if os.getpriority(os.PRIO_PROCESS, 0) < BACKGROUND_NICENESS:
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICENESS)
