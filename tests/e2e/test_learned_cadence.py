"""End to end: a source on a learned cadence, planned by the real daemon's recurring sensor."""

from __future__ import annotations

import pytest
from dagster import AssetRecordsFilter, DagsterRunStatus, RunsFilter

from assets.naming import source_asset_key
from investigations.demo.case import send_case
from investigations.intake.leads import normalize_lead
from investigations.scheduling.priority import PRIORITY_CLASS_TAG
from investigations.store import StateStore

pytestmark = pytest.mark.e2e

IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
             DagsterRunStatus.STARTED]


def test_a_lead_on_a_learned_cadence_is_collected_again_when_its_own_interval_comes_round(fleet) -> None:
    from tests.e2e.conftest import LEARNED_SOURCE, SECRET, wait_for

    lead = normalize_lead("domain", "cadence.example")
    answer = send_case(fleet.intake_url, SECRET, {"case_id": "case-cadence", "leads": [lead.as_dict()],
                                                  "sources": [LEARNED_SOURCE]}, webhook_id="msg_cadence_1")
    assert answer.status_code == 202, answer.text
    instance, key = fleet.instance, source_asset_key(LEARNED_SOURCE)
    store = StateStore.from_url(f"sqlite:///{fleet.data_dir / 'state.db'}")
    try:
        # Its first collection is the fresh lead's; the second, the recurring planner's, about 15 s
        # (the source's `every`, where a new lead's rate starts) later.
        latest, first = wait_for(
            lambda: (found := instance.fetch_materializations(
                AssetRecordsFilter(asset_key=key, asset_partitions=[lead.partition_key]), limit=2).records)
            and len(found) == 2 and found,
            timeout_s=150, what="the lead collected a second time, on its learned cadence")
        assert instance.get_run_by_id(first.run_id).tags[PRIORITY_CLASS_TAG] == "interactive"
        assert instance.get_run_by_id(latest.run_id).tags[PRIORITY_CLASS_TAG] == "recurring"
        metadata = latest.asset_materialization.metadata
        # Planned by the source's plan, which the sensor keeps: not "not planned yet".
        assert "a day, so every" in metadata["cadence"].value
        assert "not planned yet" not in metadata["cadence"].value
        assert metadata["next_due"].value > latest.timestamp
        assert store.cadence_plan(LEARNED_SOURCE) is not None
    finally:
        # A closed case's leads are not collected again: the rest of the session stays quiet, once
        # a run of the source already queued or running has finished (the next test counts run slots).
        store.set_case_status("case-cadence", "closed")
        store.close()
        busy = RunsFilter(tags={"investigations/source": LEARNED_SOURCE}, statuses=IN_FLIGHT)
        wait_for(lambda: not instance.get_runs(busy), timeout_s=60, what="the source's runs to finish")
