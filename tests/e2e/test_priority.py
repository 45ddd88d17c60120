"""End to end: an interactive lead's run is let go before queued background runs, in a free slot."""

from __future__ import annotations

import time

import pytest
from dagster import DagsterRunStatus, RunsFilter

from investigations.demo.case import send_case
from investigations.intake.leads import normalize_lead
from investigations.scheduling.priority import PRIORITY_CLASS_TAG
from investigations.store import StateStore

pytestmark = pytest.mark.e2e

# dagster.yaml's dequeue interval is 1 s; a pass hands its launches to threads, and on a loaded
# machine a launch it decided on may only be recorded (RUN_STARTING) a second or two later.
DEQUEUE_PASS_S = 3.0
# The launches of one pass run in parallel threads (`dequeue_use_threads`), each recording its own
# RUN_STARTING: a background run let go in the interactive run's own pass, after it in the pass's
# priority order, may still be recorded a little before it. Only one recorded earlier than this
# was let go in an earlier pass, while the interactive run waited.
SAME_PASS_S = 2.0
RUNNING = {DagsterRunStatus.STARTING, DagsterRunStatus.STARTED}
STARTED = {DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE}


def test_an_interactive_run_starts_before_queued_background_runs(fleet, sandbox) -> None:
    from tests.e2e.conftest import SECRET, wait_for

    store = StateStore.from_url(f"sqlite:///{fleet.data_dir / 'state.db'}")
    instance = fleet.instance
    background = [normalize_lead("domain", f"bulk{i}.example") for i in range(12)]
    for lead in background:  # as `investigations leads add` does; the new-lead sensor makes them partitions
        store.add_lead(lead, case_id="case-bulk")
    # Slow answers (under these sources' 30 s timeout) keep each background run busy for ~25 s, far
    # longer than a run takes to start on a loaded machine: two rounds of two leads; batches of 4
    # leads, two per source at once (their concurrency): four runs for the three background slots.
    for source in ("slow", "quiet"):
        sandbox.app_state.configure(source, {"delay_s": [12.0, 12.0]})
    try:
        store.enqueue([(s, lead.id) for s in ("slow", "quiet") for lead in background], origin="backfill:e2e",
                      priority_class="backfill")

        def background_runs():
            return instance.get_runs(RunsFilter(tags={"investigations/origin": "backfill:e2e"}))

        wait_for(lambda: (rs := background_runs()) and sum(r.status in STARTED for r in rs) >= 3
                 and any(r.status == DagsterRunStatus.QUEUED for r in rs),
                 timeout_s=120, what="background runs filling their slots with more queued")

        lead = normalize_lead("domain", "urgent-priority.example")
        answer = send_case(fleet.intake_url, SECRET, {"case_id": "case-urgent", "leads": [lead.as_dict()],
                                                      "sources": ["robust"]})
        assert answer.status_code == 202
        urgent_filter = RunsFilter(tags={"investigations/lead_id": lead.id})
        wait_for(lambda: instance.get_runs(urgent_filter), timeout_s=30, what="the interactive run to be created")
        running_then = [r.run_id for r in background_runs() if r.status in RUNNING]
        # A dequeue pass already under way when the run was created may still launch what it had
        # sorted before; after one more pass, whatever is still queued must wait behind it.
        time.sleep(DEQUEUE_PASS_S)
        still_queued = [r.run_id for r in background_runs() if r.status == DagsterRunStatus.QUEUED]
        (urgent,) = wait_for(lambda: [rec for rec in instance.get_run_records(urgent_filter) if rec.start_time],
                             timeout_s=60, what="the interactive run to start")
        assert urgent.dagster_run.tags[PRIORITY_CLASS_TAG] == "interactive"
        records = {rec.dagster_run.run_id: rec for rec in instance.get_run_records(
            RunsFilter(tags={"investigations/origin": "backfill:e2e"}))}

        def launched_at(run_id: str) -> float | None:
            # When the queue let the run go (its RUN_STARTING event): the queue's decision. A run
            # worker then takes 2-5 s to start on a loaded 2-core machine, more or less whatever its
            # priority, so the workers' own start times do not say in which order runs were let go.
            return instance.get_run_stats(run_id).launch_time

        urgent_launched = launched_at(urgent.dagster_run.run_id)
        assert urgent_launched is not None
        # Headroom: it did not wait for any background run that was running to finish.
        assert all(records[run_id].end_time is None or records[run_id].end_time > urgent_launched
                   for run_id in running_then)
        # Priority: no background run still queued was let go before it, in an earlier pass.
        launched = {run_id: launched_at(run_id) for run_id in still_queued}
        assert all(at is None or at > urgent_launched - SAME_PASS_S for at in launched.values()), (
            urgent_launched, launched)
    finally:
        for source in ("slow", "quiet"):
            sandbox.app_state.configure(source, {"delay_s": [0.05, 0.1]})
