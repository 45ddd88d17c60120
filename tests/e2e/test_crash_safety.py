"""End to end: a run worker killed mid-collection does not lose its lead."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from dagster import DagsterRunStatus, RunsFilter

from investigations.demo.case import send_case
from investigations.intake.leads import normalize_lead
from investigations.store import StateStore

pytestmark = pytest.mark.e2e

RECOVERY_S = 120  # well past docs/operations.md's promise for a killed run worker (about 2-5 s to the retry)


def _worker_pids(instance, run_id: str) -> list[int]:
    """The run worker's process, as the run's own event log names it ("Started process for run (pid: N).")."""
    found = (re.search(r"Started process for run \(pid: (\d+)\)", entry.message or "")
             for entry in instance.all_logs(run_id))
    return [int(match[1]) for match in found if match]


def test_a_run_worker_killed_mid_collection_is_collected_again_by_a_retry(fleet, sandbox) -> None:
    from tests.e2e.conftest import SECRET, wait_for

    store = StateStore.from_url(f"sqlite:///{fleet.data_dir / 'state.db'}")
    instance = fleet.instance
    lead = normalize_lead("domain", "killed-worker.example")
    sandbox.app_state.configure("slow", {"delay_s": [20.0, 20.0]})  # the answer waits: the worker is mid-step
    asked_before = sandbox.app_state.sources["slow"].requests
    try:
        answer = send_case(fleet.intake_url, SECRET, {"case_id": "case-crash", "leads": [lead.as_dict()],
                                                      "sources": ["slow"]})
        assert answer.status_code == 202, answer.text
        lead_runs = RunsFilter(job_name="collect_slow", tags={"investigations/lead_id": lead.id})
        (first,) = wait_for(lambda: [r for r in instance.get_runs(lead_runs) if r.status == DagsterRunStatus.STARTED],
                            timeout_s=90, what="the lead's run to start")
        wait_for(lambda: sandbox.app_state.sources["slow"].requests > asked_before, timeout_s=60,
                 what="the run's request to reach the source", interval_s=0.2)
        pids = wait_for(lambda: _worker_pids(instance, first.run_id), timeout_s=10, what="the run worker process")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        sandbox.app_state.configure("slow", {"delay_s": [0.05, 0.1]})

    collected = wait_for(lambda: (c := store.collection("slow", lead.id)) and c.outcome == "ok" and c,
                         timeout_s=RECOVERY_S, what="the lead to be collected again")
    assert time.monotonic() - killed_at < RECOVERY_S
    assert instance.get_run_by_id(first.run_id).status == DagsterRunStatus.FAILURE
    # Collected by another run (Dagster's retry of the killed one, or a new handover): once.
    assert collected.run_id != first.run_id
    wait_for(lambda: instance.get_run_by_id(collected.run_id).status == DagsterRunStatus.SUCCESS, timeout_s=60,
             what="the collecting run to succeed")
    fetched = [row for row in store.fetch_log(source="slow", lead_id=lead.id) if row["outcome"] == "ok"]
    assert len({row["run_id"] for row in fetched}) == 1
    assert store.queue_depths().get("slow", {}).get("dispatched", 0) == 0  # nothing left dispatched
