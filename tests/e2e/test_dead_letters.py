"""End to end: a source that keeps failing dead-letters its collection; a requeue collects it once."""

from __future__ import annotations

import os

import pytest
from dagster import DagsterRunStatus, RunsFilter

from investigations.cli import main
from investigations.demo.case import send_case
from investigations.intake.leads import normalize_lead
from investigations.store import StateStore

pytestmark = pytest.mark.e2e

FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def test_flaky_failures_dead_letter_and_a_double_requeue_collects_once(fleet, sandbox, monkeypatch, capsys) -> None:
    from tests.e2e.conftest import SECRET, wait_for

    lead = normalize_lead("username", "dead-letter-e2e")
    store = StateStore.from_url(f"sqlite:///{fleet.data_dir / 'state.db'}")
    instance = fleet.instance

    def runs(origin_prefix: str):
        found = instance.get_runs(RunsFilter(tags={"investigations/lead_id": lead.id}))
        return [r for r in found if r.tags.get("investigations/origin", "").startswith(origin_prefix)]

    sandbox.app_state.configure("flaky", {"error_rate": 1.0, "stall_rate": 0.0})
    try:
        answer = send_case(fleet.intake_url, SECRET, {"case_id": "case-dlq", "leads": [lead.as_dict()],
                                                      "sources": ["flaky"]})
        assert answer.status_code == 202, answer.text
        (letter,) = wait_for(lambda: store.dead_letters(source="flaky", lead_id=lead.id), timeout_s=120,
                             what="a dead letter for the flaky source")
        assert letter.reason_group in ("transient", "throttled") and letter.last_status in (500, 503)
        wait_for(lambda: (rs := runs("inbox:")) and all(r.status in FINISHED for r in rs), timeout_s=60,
                 what="the failing run to finish")
        assert {r.status for r in runs("inbox:")} == {DagsterRunStatus.FAILURE}
    finally:
        sandbox.app_state.configure("flaky", {"error_rate": 0.0})

    # The operator requeues twice; the CLI reads the same state store as the fleet.
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(fleet.data_dir))
    assert main(["dlq", "requeue", "--source", "flaky", "--lead", lead.id]) == 0
    assert main(["dlq", "requeue", "--source", "flaky", "--lead", lead.id]) == 0
    out = capsys.readouterr().out
    assert "requeued 1 of 1" in out and "requeued 0 of 1" in out

    wait_for(lambda: not store.dead_letters(source="flaky", lead_id=lead.id), timeout_s=120,
             what="the requeued collection to succeed and clear its dead letter")
    requeued_runs = wait_for(lambda: (rs := runs("requeue:")) and all(r.status in FINISHED for r in rs) and rs,
                             timeout_s=30, what="the requeued run to finish")
    assert [r.status for r in requeued_runs] == [DagsterRunStatus.SUCCESS]
    assert store.collection("flaky", lead.id).outcome == "ok"
    assert os.path.exists(store.collection("flaky", lead.id).path)
