"""End to end: leads a user adds with the CLI or the intake, then backfills, go out in whole batches."""

from __future__ import annotations

import json
import math
import re

import pytest
from dagster import AssetRecordsFilter, DagsterRunStatus, RunsFilter

from assets.naming import source_asset_key
from investigations.cli import main
from investigations.demo.case import send_case
from investigations.intake.leads import normalize_lead
from investigations.scheduling.priority import HANDOVER_TAG
from investigations.store import StateStore

pytestmark = pytest.mark.e2e

FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
BATCH = 4  # quiet's batch_max_leads in the e2e fleet (tests/e2e/conftest.py)


def test_leads_added_by_cli_and_intake_then_backfilled_run_in_whole_batches(fleet, monkeypatch, capsys) -> None:
    from tests.e2e.conftest import SECRET, wait_for

    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(fleet.data_dir))
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(fleet.sources_path))
    instance = fleet.instance
    store = StateStore.from_url(f"sqlite:///{fleet.data_dir / 'state.db'}")
    by_intake = normalize_lead("domain", "intake-backfill.example")
    answer = send_case(fleet.intake_url, SECRET, {"case_id": "case-bulk-e2e", "leads": [by_intake.as_dict()],
                                                  "sources": ["quiet"], "priority": "backfill"})
    assert answer.status_code == 202, answer.text
    # Its own collection first, so that the backfill below finds every lead free to batch.
    wait_for(lambda: any(row["lead_id"] == by_intake.id for row in store.fetch_log(source="quiet", limit=100_000))
             and all(r.status in FINISHED for r in instance.get_runs(RunsFilter(job_name="collect_quiet"))),
             timeout_s=120, what="the intake's backfill lead to be collected")
    by_cli = [normalize_lead("domain", f"cli-{i}.example") for i in range(9)]
    for lead in by_cli:
        assert main(["leads", "add", "domain", lead.value, "--case", "case-bulk-e2e"]) == 0
    assert main(["backfill", "--source", "quiet"]) == 0
    printed = re.search(r"queued (\d+) of \d+ lead\(s\) for quiet as backfill \((backfill:[^)]+)\)",
                        capsys.readouterr().out)
    assert printed, "the backfill says what it queued"
    queued, origin = int(printed[1]), printed[2]
    assert queued >= 10

    def backfill_runs():
        return instance.get_runs(RunsFilter(job_name="collect_quiet", tags={"investigations/origin": origin}))

    def done():
        rows = store.fetch_log(source="quiet", limit=100_000)
        collected = {row["lead_id"] for row in rows}
        runs = backfill_runs()
        return runs and all(r.status in FINISHED for r in runs) and {by_intake.id, *(lead.id for lead in by_cli)} <= collected

    wait_for(done, timeout_s=180, what="the backfill's runs to finish")
    runs = backfill_runs()
    assert {r.status for r in runs} == {DagsterRunStatus.SUCCESS}
    # One run per whole batch, not one per lead: the leads were partitions before their first run.
    assert len(runs) == math.ceil(queued / BATCH)
    assert all(HANDOVER_TAG in r.tags for r in runs if r.tags.get("investigations/batch_size", "1") != "1")
    partitions = set(instance.get_dynamic_partitions("leads"))
    assert {by_intake.partition_key, *(lead.partition_key for lead in by_cli)} <= partitions
    materialized = instance.get_materialized_partitions(source_asset_key("quiet"))
    assert {lead.partition_key for lead in by_cli} <= materialized

    # The Runs page by a lead: the CLI names the batch run that Dagster says materialized the lead's
    # partition, and links to the Runs page filtered to its runs.
    lead = by_cli[0]
    (record,) = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=source_asset_key("quiet"), asset_partitions=[lead.partition_key]), limit=1).records
    capsys.readouterr()
    assert main(["leads", "runs", f"domain:{lead.value}", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert record.run_id in {row["run_id"] for row in answer["runs"]}
    assert instance.get_run_by_id(record.run_id).tags.get("investigations/batch_size", "1") != "1"
    assert f"q%5B%5D=id%3A{record.run_id}" in answer["runs_page"]
