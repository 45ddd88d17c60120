"""Source assets materialize a lead's partition against the sandbox web over loopback."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from dagster import (
    AssetCheckKey,
    AssetCheckSeverity,
    AssetMaterialization,
    AssetRecordsFilter,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    Definitions,
    TimestampMetadataValue,
    define_asset_job,
    materialize,
)

from assets.naming import EMPTY_CHECK_NAME, source_asset_key
from assets.sources import CHECK_GROUP_LEADS, CHECK_GROUP_S, PendingChecks, build_source_asset, leads_text
from investigations.config import Settings
from investigations.evidence.records import RecordStore
from investigations.fleet.degradation import Verdict, answer_verdict
from investigations.intake.leads import Lead, normalize_lead
from investigations.pacing import Circuits
from investigations.scheduling.dispatch import plan_recurring
from investigations.scheduling.priority import (
    CHECKS_IN_STEP_TAG,
    HANDOVER_TAG,
    LEADS_TAG,
    PriorityClass,
    run_tags,
)
from investigations.sources.catalog import load_catalog
from investigations.sources.specs import load_sources, parse_sources
from investigations.store import StateStore
from investigations.store import schema as s
from resources.fleet import FleetResource
from tests.fakes import FakeClock


@pytest.fixture
def world(sandbox_env: Path):
    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    lead = normalize_lead("domain", "Example.COM.")
    store.add_lead(lead, case_id="case-1")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("leads", [lead.partition_key])
    yield settings, lead, instance, store
    store.close()


def _materialize(spec, lead, instance, **fleet_fields):
    return materialize(
        [build_source_asset(spec)],
        partition_key=lead.partition_key,
        instance=instance,
        resources={"fleet": FleetResource(**fleet_fields)},
        raise_on_error=False,
    )


def test_robust_partition_stores_records_and_passes_the_empty_check(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("robust")
    result = _materialize(spec, lead, instance)
    assert result.success
    (mat,) = result.asset_materializations_for_node("sources__robust")
    assert mat.partition == lead.partition_key
    assert mat.metadata["records"].value >= 1
    assert Path(mat.metadata["path"].value).exists()
    (check,) = result.get_asset_check_evaluations()
    assert check.passed


def test_a_partition_is_keyed_by_the_lead_as_investigators_type_it(world) -> None:
    settings, lead, instance, _ = world
    assert instance.get_dynamic_partitions("leads") == ["domain:example.com"]
    result = _materialize(load_catalog(settings.sources_path).get("robust"), lead, instance)
    (mat,) = result.asset_materializations_for_node("sources__robust")
    (check,) = result.get_asset_check_evaluations()
    assert mat.partition == check.partition == "domain:example.com"
    assert Path(mat.metadata["path"].value).name == f"{lead.id}.parquet"  # the store keeps the lead's id


def test_a_lead_registered_before_readable_keys_is_still_reported_on_its_id(world) -> None:
    settings, _, instance, store = world
    older = normalize_lead("domain", "older.example")
    store.add_lead(older, case_id="case-1")
    with store.engine.begin() as conn:  # as schema version 13 left it: no partition key of its own
        conn.execute(s.leads.update().where(s.leads.c.lead_id == older.id).values(partition_key=None))
    instance.add_dynamic_partitions("leads", [older.id])
    result = materialize([build_source_asset(load_catalog(settings.sources_path).get("robust"))],
                         partition_key=older.id, instance=instance, resources={"fleet": FleetResource()})
    (mat,) = result.asset_materializations_for_node("sources__robust")
    (check,) = result.get_asset_check_evaluations()
    assert mat.partition == check.partition == older.id


def test_a_lead_s_first_records_are_first_seen_and_the_same_again_adds_nothing(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("robust")
    first = _materialize(spec, lead, instance)
    (mat,) = first.asset_materializations_for_node("sources__robust")
    records = mat.metadata["records"].value
    assert (mat.metadata["first_seen"].value, mat.metadata["added"].value) == (records, 0)
    again = _materialize(spec, lead, instance)
    (mat,) = again.asset_materializations_for_node("sources__robust")
    assert [mat.metadata[k].value for k in ("first_seen", "added", "removed", "modified")] == [0, 0, 0, 0]
    # One visit, seconds after the first answer, unchanged: it says next to nothing yet, so the lead's
    # estimated changes a day are still its source's prior (once per recrawl interval).
    assert mat.metadata["changes_per_day"].value == pytest.approx(86_400 / spec.recrawl.prior_s, rel=1e-3)


def _stored_metadata(instance: DagsterInstance, source: str, partition_key: str) -> dict:
    """The lead's latest materialization's metadata, as the Dagster instance stored it."""
    (record,) = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=source_asset_key(source), asset_partitions=[partition_key]), limit=1).records
    materialization = record.asset_materialization
    assert materialization is not None
    return dict(materialization.metadata)


def _collected_at(store: StateStore, source: str, lead_id: str) -> float:
    collection = store.collection(source, lead_id)
    assert collection is not None and collection.last_success_at is not None
    return collection.last_success_at.timestamp()


def test_a_materialization_says_when_its_fixed_cadence_source_looks_at_the_lead_next_and_why(world) -> None:
    settings, lead, instance, store = world
    spec = load_catalog(settings.sources_path).get("robust")  # recrawl_every: 6h
    assert _materialize(spec, lead, instance).success
    metadata = _stored_metadata(instance, "robust", lead.partition_key)
    assert isinstance(metadata["next_due"], TimestampMetadataValue)
    assert metadata["next_due"].value == pytest.approx(_collected_at(store, "robust", lead.id) + 6 * 3600)
    assert metadata["cadence"].value == "fixed cadence: every 6 h"


LEARNED_YAML = """
sources:
  - name: learned
    adapter: json_api
    lead_kinds: [domain]
    request:
      url: "${INVESTIGATIONS_SANDBOX_URL}/robust/api/lookup?kind={kind}&q={value}"
    parse:
      records_path: results
      record_key: id
      fields: {type: type, value: value, first_seen: first_seen, url: source_url}
    recrawl: {min: 1h, max: 30d, every: 6h}
"""


def test_a_materialization_of_a_learned_cadence_reads_its_source_s_last_plan(world, tmp_path: Path) -> None:
    _, lead, instance, store = world
    path = tmp_path / "learned.yaml"
    path.write_text(LEARNED_YAML)
    catalog = load_sources(path)
    spec = catalog.get("learned")
    assert _materialize(spec, lead, instance, sources_path=str(path)).success
    assert "not planned yet" in _stored_metadata(instance, "learned", lead.partition_key)["cadence"].value
    plan_recurring(store, catalog)  # the recurring planner's pass keeps the source's plan
    assert _materialize(spec, lead, instance, sources_path=str(path)).success
    metadata = _stored_metadata(instance, "learned", lead.partition_key)
    # Its source's only lead: the budget of one lead every 6 h (`every`) is all its own.
    assert metadata["cadence"].value.endswith("so every 6 h")
    assert metadata["next_due"].value == pytest.approx(_collected_at(store, "learned", lead.id) + 6 * 3600, rel=1e-3)
    assert metadata["changes_per_day"].value == pytest.approx(4.0, rel=1e-2)


def test_a_materialization_of_a_lead_not_collected_again_has_no_next_due_and_says_so(world) -> None:
    settings, lead, instance, store = world
    store.set_case_status("case-1", "closed")
    spec = load_catalog(settings.sources_path).get("robust")
    assert _materialize(spec, lead, instance).success
    metadata = _stored_metadata(instance, "robust", lead.partition_key)
    assert "next_due" not in metadata
    assert metadata["cadence"].value == "not collected again: only closed cases hold it"


def test_without_an_identities_file_the_materialization_names_the_direct_identity(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("robust")
    (mat,) = _materialize(spec, lead, instance).asset_materializations_for_node("sources__robust")
    assert (mat.metadata["identity_ids"].value, mat.metadata["lease_ids"].value) == (["direct"], [])


def test_rematerializing_the_same_answer_is_unchanged_and_points_at_the_new_capture(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("robust")
    first = _materialize(spec, lead, instance).asset_materializations_for_node("sources__robust")[0]
    path = Path(first.metadata["path"].value)
    digest, captures = RecordStore.stored_hash(path), set(pq.read_table(path).column("capture_id").to_pylist())
    second = _materialize(spec, lead, instance).asset_materializations_for_node("sources__robust")[0]
    assert second.metadata["changed"].value is False
    assert RecordStore.stored_hash(path) == digest
    assert set(pq.read_table(path).column("capture_id").to_pylist()).isdisjoint(captures)


def test_empty_check_fails_on_the_silently_empty_source(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("quiet")
    result = _materialize(spec, lead, instance)
    assert result.success  # the data is stored, and flagged rather than trusted
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed
    assert check.severity == AssetCheckSeverity.ERROR
    assert check.metadata["records"].value == 0
    assert check.metadata["expected_min_records"].value == 1


def test_a_source_that_keeps_failing_fails_the_run_and_leaves_a_dead_letter(world, tmp_path: Path) -> None:
    settings, lead, instance, store = world
    broken = tmp_path / "sources.yaml"
    broken.write_text(
        "sources:\n"
        "  - name: closed\n"
        "    adapter: json_api\n"
        "    lead_kinds: [domain]\n"
        "    request: {url: 'http://127.0.0.1:9/lookup?q={value}'}\n"
        "    retry: {attempts: 2, base_delay_s: 0.01, max_delay_s: 0.02, step_retries: 0}\n"
    )
    spec = parse_sources(broken.read_text(), env={}).get("closed")
    result = _materialize(spec, lead, instance, sources_path=str(broken))
    assert not result.success
    (letter,) = store.dead_letters(source="closed")
    assert letter.lead_id == lead.id and letter.reason_group == "transient" and letter.attempts == 2


def _three_more_leads(world) -> list[Lead]:
    """Three more leads of the world's case after its one, each with its partition."""
    _, _, instance, store = world
    others = [normalize_lead("domain", f"batch{i}.example") for i in range(3)]
    for other in others:
        store.add_lead(other, case_id="case-1")
    instance.add_dynamic_partitions("leads", [other.partition_key for other in others])
    return others


def _batch_of_four(world):
    """Three more leads after the world's one, and a function running robust over the four."""
    settings, lead, instance, _ = world
    others = _three_more_leads(world)
    spec = load_catalog(settings.sources_path).get("robust")

    def run():
        return materialize(
            [build_source_asset(spec)],
            instance=instance,
            tags={"dagster/asset_partition_range_start": lead.partition_key, "dagster/asset_partition_range_end": others[-1].partition_key},
            resources={"fleet": FleetResource()},
        )

    return others, run


def test_a_batch_run_collects_every_lead_of_a_partition_range(world) -> None:
    _, lead, _, _ = world
    others, run = _batch_of_four(world)
    result = run()
    mats = result.asset_materializations_for_node("sources__robust")
    assert sorted(m.partition for m in mats) == sorted([lead.partition_key, *(o.partition_key for o in others)])
    checks = result.get_asset_check_evaluations()
    assert sorted(c.partition for c in checks) == sorted(m.partition for m in mats) and all(c.passed for c in checks)


def _asset_alone_over_four(world, **tags: str):
    """Three more leads after the world's one, and robust run over the four without its check selected."""
    settings, lead, instance, _ = world
    others = _three_more_leads(world)
    range_tags = {"dagster/asset_partition_range_start": lead.partition_key,
                  "dagster/asset_partition_range_end": others[-1].partition_key}
    result = materialize(
        [build_source_asset(load_catalog(settings.sources_path).get("robust"))], instance=instance,
        selection=AssetSelection.assets(source_asset_key("robust")).without_checks(),
        tags={**range_tags, **tags}, resources={"fleet": FleetResource()},
    )
    assert result.success
    return result, [lead, *others]


def test_a_dispatched_batch_judges_every_lead_without_dagster_planning_a_check_row_per_partition(world) -> None:
    instance = world[2]
    # As the dispatcher requests a batch: the asset alone, its check judged in the step.
    result, leads = _asset_alone_over_four(world, **{CHECKS_IN_STEP_TAG: "true"})
    planned = instance.get_records_for_run(result.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED).records
    assert planned == []
    # Every lead's result is the run's and counts as its partition's current one in Dagster.
    assert _check_partition_states(instance, "robust") == {one.partition_key: "SUCCEEDED" for one in leads}
    evaluated = instance.get_records_for_run(result.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION).records
    assert len(evaluated) == 4


def test_a_range_run_launched_without_the_check_is_not_judged(world) -> None:
    # A user's choice in the UI: materialize the asset alone.
    result, _ = _asset_alone_over_four(world)
    assert len(result.asset_materializations_for_node("sources__robust")) == 4
    assert result.get_asset_check_evaluations() == []


def test_a_batch_run_names_its_leads_by_value_in_a_run_tag(world) -> None:
    _, lead, instance, _ = world
    others, run = _batch_of_four(world)
    result = run()
    tag = instance.get_run_by_id(result.run_id).tags[LEADS_TAG]  # read back from Dagster's run record
    assert sorted(tag.split(", ")) == sorted(f"{one.kind}:{one.value}" for one in [lead, *others])


def test_the_leads_tag_counts_the_leads_that_do_not_fit() -> None:
    leads = {f"id{i}": Lead("domain", f"lead-{i:03d}.example") for i in range(100)}
    text = leads_text(list(leads), leads, limit=120)
    assert len(text) <= 120 and text.startswith("domain:lead-000.example, domain:lead-001.example")
    shown = text.count("domain:")
    assert text.endswith(f", + {100 - shown} more")
    assert leads_text(["id1", "id2"], leads) == "domain:lead-001.example, domain:lead-002.example"
    assert leads_text(["unknown"], {}) == "unknown"  # an id the store does not hold is shown as it is


def test_a_collection_whose_circuit_is_open_is_parked_not_failed(world) -> None:
    settings, lead, instance, store = world
    spec = load_catalog(settings.sources_path).get("robust")
    circuits = Circuits(store)
    for _ in range(spec.circuit.failure_threshold):
        circuits.record("robust", spec.circuit, success=False)
    store.enqueue([("robust", lead.id)], origin="test", priority_class="interactive")
    store.dispatch("robust", limit=1)
    result = _materialize(spec, lead, instance)
    assert result.success
    assert result.asset_materializations_for_node("sources__robust") == []
    assert store.queue_depths()["robust"]["waiting"] == 1  # back in the queue until the rest is over
    assert store.dead_letters() == []


def test_the_empty_check_alone_judges_what_is_stored_without_fetching(world, sandbox) -> None:
    settings, lead, instance, store = world
    spec = load_catalog(settings.sources_path).get("quiet")
    _materialize(spec, lead, instance)
    requests_before = sandbox.app_state.sources["quiet"].requests
    defs = Definitions(
        assets=[build_source_asset(spec)],
        jobs=[define_asset_job("check_only", selection=AssetSelection.checks_for_assets(source_asset_key("quiet")))],
        resources={"fleet": FleetResource()},
    )
    result = defs.resolve_job_def("check_only").execute_in_process(instance=instance, tags={"dagster/partition": lead.partition_key})
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.metadata["records"].value == 0
    assert sandbox.app_state.sources["quiet"].requests == requests_before


def test_a_batch_run_collects_only_its_member_leads_inside_the_envelope(world) -> None:
    settings, lead, instance, store = world
    others = _three_more_leads(world)
    spec = load_catalog(settings.sources_path).get("robust")
    members = [lead.id, others[2].id]
    # As the dispatcher hands a batch over: its rows dispatched and recorded under the batch's key.
    store.enqueue([("robust", member) for member in members], origin="backfill:1", priority_class="backfill")
    rows = store.dispatch("robust", limit=10)
    store.assign_handover([row.id for row in rows], handover_key="robust:batch:test")
    result = materialize(
        [build_source_asset(spec)],
        instance=instance,
        resources={"fleet": FleetResource()},
        tags={"dagster/asset_partition_range_start": lead.partition_key, "dagster/asset_partition_range_end": others[2].partition_key,
              HANDOVER_TAG: "robust:batch:test"},
    )
    assert sorted(m.partition for m in result.asset_materializations_for_node("sources__robust")) == sorted(
        [lead.partition_key, others[2].partition_key])


def test_a_fresh_lead_joined_to_a_run_before_it_started_is_collected_first(world) -> None:
    settings, lead, instance, store = world
    others = _three_more_leads(world)
    spec = load_catalog(settings.sources_path).get("robust").model_copy(update={"concurrency": 1})
    before = datetime.now(UTC) - timedelta(seconds=5)
    store.enqueue([("robust", other.id) for other in others], origin="inbox:1", priority_class="interactive",
                  case_id="big-case", now=before)
    rows = store.dispatch("robust", limit=10, now=before)
    store.assign_handover([row.id for row in rows], handover_key="robust:batch:open")
    store.enqueue([("robust", lead.id)], origin="inbox:2", priority_class="interactive", case_id="fresh-case")
    store.open_collector("robust:batch:open", "robust", until_s=time.time() + 30)  # requested, not started yet
    joined = store.dispatch("robust", limit=1)
    assert store.join_collector("robust:batch:open", [row.id for row in joined], now_s=time.time())
    result = materialize(
        [build_source_asset(spec)], instance=instance, resources={"fleet": FleetResource()},
        tags={"dagster/asset_partition_range_start": others[0].partition_key, "dagster/asset_partition_range_end": others[2].partition_key,
              HANDOVER_TAG: "robust:batch:open"},
    )
    order = [m.partition for m in result.asset_materializations_for_node("sources__robust")]
    assert order[0] == lead.partition_key and sorted(order[1:]) == sorted(other.partition_key for other in others)


def test_an_open_run_reports_its_leads_checks_when_they_are_done_not_after_its_linger(world, monkeypatch) -> None:
    import assets.sources
    from investigations.collection.runwork import RunWork

    class Lingering(RunWork):  # the open run's linger, short enough for a test
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, linger_s=3.0, **kwargs)

    monkeypatch.setattr(assets.sources, "RunWork", Lingering)
    settings, lead, instance, store = world
    spec = load_catalog(settings.sources_path).get("robust")
    store.enqueue([("robust", lead.id)], origin="inbox:1", priority_class="interactive", case_id="case-1")
    (row,) = store.dispatch("robust", limit=1)
    store.assign_handover([row.id], handover_key="robust:open")
    result = materialize([build_source_asset(spec)], instance=instance, resources={"fleet": FleetResource()},
                         partition_key=lead.partition_key,
                         tags={HANDOVER_TAG: "robust:open", **run_tags(PriorityClass.INTERACTIVE)})
    (stored,) = [event for event in result.all_events if event.event_type_value == "ASSET_MATERIALIZATION"]
    (checked,) = [event for event in result.all_events if event.event_type_value == "ASSET_CHECK_EVALUATION"]
    (ended,) = [event for event in result.all_events if event.event_type_value == "STEP_SUCCESS"]
    times = {record.dagster_event.event_type_value: record.timestamp for record in instance.all_logs(result.run_id)
             if record.dagster_event is not None}
    assert stored and checked and ended
    assert times["ASSET_CHECK_EVALUATION"] - times["ASSET_MATERIALIZATION"] < 1.0  # not held for the linger
    assert times["STEP_SUCCESS"] - times["ASSET_MATERIALIZATION"] >= 3.0  # which the run still waited


def test_a_retry_of_a_run_killed_after_it_stored_its_lead_succeeds_collecting_nothing(world, sandbox) -> None:
    """The run worker was killed after the lead's bookkeeping; Dagster's retry finds nothing owed."""
    settings, lead, instance, store = world
    spec = load_catalog(settings.sources_path).get("robust")
    store.enqueue([("robust", lead.id)], origin="inbox:1", priority_class="interactive")
    (row,) = store.dispatch("robust", limit=1)
    store.assign_handover([row.id], handover_key="robust:killed")
    store.finish_dispatched("robust", lead.id, outcome="ok")  # what the killed run did before it died
    requests_before = sandbox.app_state.sources["robust"].requests
    result = materialize([build_source_asset(spec)], instance=instance, resources={"fleet": FleetResource()},
                         partition_key=lead.partition_key, tags={HANDOVER_TAG: "robust:killed"})
    assert result.success
    assert result.asset_materializations_for_node("sources__robust") == []
    assert sandbox.app_state.sources["robust"].requests == requests_before


def test_a_run_worker_leaves_what_it_loaded_out_of_full_garbage_collections() -> None:
    # In a child process: freezing is for the life of a process, and this one runs the other tests.
    code = ("import gc, time, definitions; from assets.sources import freeze_startup_objects as freeze; "
            "freeze(); frozen = gc.get_freeze_count(); freeze(); "
            "start = time.perf_counter(); gc.collect(); pause = time.perf_counter() - start; "
            "print(frozen, gc.get_freeze_count(), pause)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    frozen, again, pause = done.stdout.split()
    assert int(frozen) > 100_000 and int(again) == int(frozen)  # the definitions' objects, once
    assert float(pause) < 0.05  # a full collection no longer walks them (about 0.1 s before)


def test_a_worker_forked_from_a_frozen_process_freezes_its_own_run_objects_too() -> None:
    # The run launcher's template froze what it imported; the worker forked from it still freezes
    # what its run then built (the definitions are the template's, the run's context is its own).
    code = ("import gc, os, definitions\nfrom assets.sources import freeze_startup_objects as freeze\n"
            "freeze(); template = gc.get_freeze_count()\n"
            "if os.fork() == 0:\n"
            "    run_objects = [[] for _ in range(10_000)]\n"
            "    freeze(); print(gc.get_freeze_count() - template, flush=True); os._exit(0)\n"
            "os.wait()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert int(done.stdout.split()[-1]) >= 10_000


def _check_partition_states(instance: DagsterInstance, source: str) -> dict[str, str]:
    """Each partition's check state as Dagster's UI counts it: a result is current only when it
    names the partition's latest materialization; any other counts as missing."""
    infos = instance.event_log_storage.get_asset_check_partition_info(
        [AssetCheckKey(source_asset_key(source), EMPTY_CHECK_NAME)]
    )
    return {i.partition_key: i.latest_execution_status.value if i.is_current else "MISSING" for i in infos}


def test_a_single_lead_check_result_counts_as_the_partitions_current_result(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("quiet")
    result = _materialize(spec, lead, instance)
    assert result.success
    assert _check_partition_states(instance, "quiet") == {lead.partition_key: "FAILED"}
    messages = [e.message for e in instance.all_logs(result.run_id)]
    assert not [m for m in messages if "did not yield or return expected outputs" in m]


def test_every_lead_of_a_batch_run_gets_a_current_check_result(world) -> None:
    _, lead, instance, _ = world
    others, run = _batch_of_four(world)
    for _ in range(2):  # the second run's results replace the first's as current
        result = run()
    assert _check_partition_states(instance, "robust") == {lead.partition_key: "SUCCEEDED", **{o.partition_key: "SUCCEEDED" for o in others}}
    assert not [e for e in instance.all_logs(result.run_id) if "did not yield" in e.message]


def test_a_materialization_names_its_lead_and_row_count(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("robust")
    _materialize(spec, lead, instance)
    event = instance.get_latest_materialization_event(source_asset_key("robust"))
    metadata = event.asset_materialization.metadata
    assert metadata["lead_kind"].value == "domain" and metadata["lead_value"].value == "example.com"
    assert metadata["dagster/row_count"].value == metadata["records"].value >= 1


def test_a_materialization_carries_its_cost_and_marks_work_done_past_the_budget(world, tmp_path, monkeypatch) -> None:
    settings, lead, instance, store = world
    text = (Path(settings.sources_path).read_text()
            .replace("    daily_budget_usd: 5\n", "    daily_budget_usd: 0.001\n    cost_per_request_usd: 0.01\n", 1))
    (tmp_path / "priced.yaml").write_text(text)
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(tmp_path / "priced.yaml"))
    spec = parse_sources(text).get("robust")
    _materialize(spec, lead, instance)
    first = instance.get_latest_materialization_event(source_asset_key("robust")).asset_materialization.metadata
    assert first["cost_usd"].value == pytest.approx(0.01 * first["requests"].value)
    assert "over_budget" not in first  # nothing was spent when the run began
    _materialize(spec, lead, instance)
    second = instance.get_latest_materialization_event(source_asset_key("robust")).asset_materialization.metadata
    assert second["over_budget"].value is True


def test_collections_lease_their_identities_through_the_proxy_resource(world, tmp_path) -> None:
    from resources.identities import IdentityPoolResource

    settings, lead, instance, _ = world
    path = tmp_path / "identities.yaml"
    path.write_text("tiers: [datacenter]\nidentities:\n  - {id: dc1_a, range: dc1, tier: datacenter}\n")
    # The fleet itself names no identities file: what it goes out as is the proxy resource's.
    proxies = IdentityPoolResource(identities_path=str(path))
    result = materialize([build_source_asset(load_catalog(settings.sources_path).get("robust"))],
                         partition_key=lead.partition_key, instance=instance,
                         resources={"fleet": FleetResource(identities=proxies), "identities": proxies})
    assert result.success
    (mat,) = result.asset_materializations_for_node("sources__robust")
    assert mat.metadata["identity_ids"].value == ["dc1_a"]


# -- check results in groups ---------------------------------------------------------------------


def _passing() -> Verdict:
    return answer_verdict(records=3, expected_min=1, baseline=[], fields=[], baseline_fields=[])


def test_a_group_of_check_results_names_each_leads_latest_materialization_in_one_lookup() -> None:
    spec = parse_sources(Path("sources.yaml").read_text()).get("robust")
    key = source_asset_key("robust")
    with DagsterInstance.ephemeral() as instance:
        for partition in ("lead-a", "lead-b", "lead-a", "lead-c"):  # lead-a twice: its second is the latest
            instance.report_runless_asset_event(AssetMaterialization(key, partition=partition))
        latest = {p: instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[p]),
                                                     limit=1).records[0].storage_id for p in ("lead-a", "lead-b")}
        lookups = []
        fetch = instance.fetch_materializations
        instance.fetch_materializations = lambda *a, **k: lookups.append(a) or fetch(*a, **k)  # type: ignore[method-assign]
        checks = PendingChecks(instance, spec)
        checks.add("lead-a", _passing(), [])
        checks.add("lead-b", _passing(), [])
        checks.add("lead-never", _passing(), [])
        results = {r.partition: r.target_materialization_data for r in checks.take()}
    assert len(lookups) == 1
    assert {p: t.storage_id for p, t in results.items() if t} == latest
    assert results["lead-never"] is None
    assert checks.take() == []


def test_check_results_are_due_at_a_full_group_or_once_the_oldest_has_waited() -> None:
    spec = parse_sources(Path("sources.yaml").read_text()).get("robust")
    clock = FakeClock(100.0)
    with DagsterInstance.ephemeral() as instance:
        checks = PendingChecks(instance, spec, clock=clock)
        assert not checks.due()
        checks.add("lead-0", _passing(), [])
        clock.now += CHECK_GROUP_S - 0.1
        assert not checks.due()
        clock.now += 0.1
        assert checks.due()
        checks.take()
        for n in range(CHECK_GROUP_LEADS - 1):
            checks.add(f"lead-{n}", _passing(), [])
        assert not checks.due()
        checks.add("lead-last", _passing(), [])
        assert checks.due()

