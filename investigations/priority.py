"""Priority classes and how they map onto Dagster's run queue.

`dagster/priority` orders the queue (higher first); the class itself travels as our own tag so the
run-queue headroom rules and the metrics can tell interactive work from background work.
"""

from __future__ import annotations

from enum import StrEnum


class PriorityClass(StrEnum):
    INTERACTIVE = "interactive"  # a fresh lead in an active case: an investigator is waiting
    RECURRING = "recurring"  # a cadence re-crawl of monitored leads
    BACKFILL = "backfill"  # bulk work that must yield to everything else


# Wide gaps leave room for finer ordering inside a class later without renumbering.
DAGSTER_PRIORITY: dict[PriorityClass, int] = {
    PriorityClass.INTERACTIVE: 100,
    PriorityClass.RECURRING: 0,
    PriorityClass.BACKFILL: -100,
}

PRIORITY_CLASS_TAG = "investigations/priority_class"
