"""End to end with real processes: a signed webhook becomes queued runs, records and checks."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from dagster import AssetCheckKey, DagsterRunStatus, RunsFilter

from assets.naming import EMPTY_CHECK_NAME, source_asset_key
from investigations.demo.case import send_case
from investigations.evidence.records import RecordStore
from investigations.intake.leads import normalize_lead
from investigations.scheduling.priority import CASE_TAG
from investigations.store import StateStore
from resources.dagster_internals import AssetCheckExecutionRecordStatus
from resources.run_launcher import WORKER_TAG

pytestmark = pytest.mark.e2e

LEADS = [
    {"kind": "domain", "value": "Northwind-Traders.example."},
    {"kind": "domain", "value": "contoso.example"},
    {"kind": "username", "value": "@robin_example"},
]
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def _runs_for(instance, lead_ids):
    runs = instance.get_runs(RunsFilter(tags={"investigations/source": "robust"}))
    return [r for r in runs if r.tags.get("investigations/lead_id") in lead_ids]


def test_a_signed_case_goes_out_as_one_run_whose_leads_each_get_a_materialization_and_check(fleet) -> None:
    from tests.e2e.conftest import SECRET, wait_for

    leads = [normalize_lead(item["kind"], item["value"]) for item in LEADS]
    lead_ids, partition_keys = {lead.id for lead in leads}, {lead.partition_key for lead in leads}
    answer = send_case(fleet.intake_url, SECRET, {"case_id": "case-e2e", "leads": LEADS, "sources": ["robust"]},
                       webhook_id="msg_e2e_1")
    assert answer.status_code == 202, answer.text
    instance = fleet.instance
    case_runs = RunsFilter(tags={CASE_TAG: "case-e2e", "investigations/source": "robust"})
    (run,) = wait_for(
        lambda: (rs := instance.get_runs(case_runs)) and all(r.status in FINISHED for r in rs) and rs,
        timeout_s=150, what="the case's finished robust run",
    )
    assert run.status == DagsterRunStatus.SUCCESS
    assert run.tags["dagster/priority"] == "100" and run.tags["investigations/batch_size"] == "3"
    # Its worker was forked by the fleet's run launcher on this machine, and announced itself.
    worker = json.loads(run.tags[WORKER_TAG])
    assert any(entry.message == f"Started process for run (pid: {worker['pid']})." for entry in instance.all_logs(run.run_id))
    key = source_asset_key("robust")
    # Each lead's partition is keyed by its value, as the UI's partition filter finds it.
    assert partition_keys == {"domain:northwind-traders.example", "domain:contoso.example", "username:robin_example"}
    assert instance.get_materialized_partitions(key) >= partition_keys
    checks = instance.event_log_storage.get_asset_check_partition_info([AssetCheckKey(key, EMPTY_CHECK_NAME)])
    passed = {info.partition_key for info in checks
              if info.is_current and info.latest_execution_status == AssetCheckExecutionRecordStatus.SUCCEEDED}
    assert passed >= partition_keys
    records = RecordStore(fleet.data_dir / "records")
    for lead_id in lead_ids:
        table = records.read("robust", lead_id)
        assert table is not None and table.num_rows >= 1


def test_forged_signature_stores_nothing(fleet) -> None:
    from tests.e2e.conftest import wait_for  # noqa: F401 - same module world

    store = StateStore.from_url(f"sqlite:///{fleet.data_dir / 'state.db'}")
    before = len(store.inbox_after(0, limit=10_000))
    answer = send_case(fleet.intake_url, "whsec_" + "Zm9yZ2VkLXNlY3JldC1vZi1hbi1hdHRhY2tlcg==",
                       {"case_id": "case-forged", "leads": [{"kind": "domain", "value": "forged.example"}]})
    assert answer.status_code == 401
    assert len(store.inbox_after(0, limit=10_000)) == before
    assert store.get_lead(normalize_lead("domain", "forged.example").id) is None


def test_collecting_a_lead_again_keeps_its_records_and_points_at_the_new_capture(fleet) -> None:
    from tests.e2e.conftest import SECRET, wait_for

    lead = normalize_lead("domain", "fabrikam.example")
    body = {"case_id": "case-rerun", "leads": [lead.as_dict()], "sources": ["robust"]}
    instance = fleet.instance
    path = RecordStore(fleet.data_dir / "records").path_for("robust", lead.id)

    assert send_case(fleet.intake_url, SECRET, body, webhook_id="msg_rerun_1").status_code == 202
    wait_for(lambda: [r for r in _runs_for(instance, {lead.id}) if r.status in FINISHED],
             timeout_s=120, what="the first run of the lead")
    digest = RecordStore.stored_hash(path)  # the records' content, without fetch time or capture
    captures = set(pq.read_table(path).column("capture_id").to_pylist())

    # A second delivery (another webhook) re-runs the same partition through the whole path.
    assert send_case(fleet.intake_url, SECRET, {**body, "case_id": "case-rerun-2"},
                     webhook_id="msg_rerun_2").status_code == 202
    runs = wait_for(
        lambda: (rs := _runs_for(instance, {lead.id})) and len(rs) == 2 and all(r.status in FINISHED for r in rs) and rs,
        timeout_s=120, what="the second run of the lead",
    )
    assert {r.status for r in runs} == {DagsterRunStatus.SUCCESS}
    assert RecordStore.stored_hash(path) == digest
    assert set(pq.read_table(path).column("capture_id").to_pylist()).isdisjoint(captures)
