"""Source assets materialize a lead's partition against the sandbox web over loopback."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, AssetSelection, DagsterInstance, Definitions, define_asset_job, materialize

from assets.naming import source_asset_key
from assets.sources import build_source_asset
from investigations.catalog import load_catalog
from investigations.config import Settings
from investigations.leads import normalize_lead
from investigations.pacing import Circuits
from investigations.priority import BACKGROUND_NICENESS, HANDOVER_TAG, PriorityClass, run_tags
from investigations.specs import parse_sources
from investigations.store import StateStore
from resources.fleet import FleetResource


@pytest.fixture
def world(sandbox_env: Path):
    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    lead = normalize_lead("domain", "Example.COM.")
    store.add_lead(lead, case_id="case-1")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("leads", [lead.id])
    yield settings, lead, instance, store
    store.close()


def _materialize(spec, lead, instance, **fleet_fields):
    return materialize(
        [build_source_asset(spec)],
        partition_key=lead.id,
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
    assert mat.partition == lead.id
    assert mat.metadata["records"].value >= 1
    assert Path(mat.metadata["path"].value).exists()
    (check,) = result.get_asset_check_evaluations()
    assert check.passed


def test_without_an_identities_file_the_materialization_names_the_direct_identity(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("robust")
    (mat,) = _materialize(spec, lead, instance).asset_materializations_for_node("sources__robust")
    assert (mat.metadata["identity_ids"].value, mat.metadata["lease_ids"].value) == (["direct"], [])


def test_rematerializing_leaves_the_parquet_file_byte_identical(world) -> None:
    settings, lead, instance, _ = world
    spec = load_catalog(settings.sources_path).get("robust")
    first = _materialize(spec, lead, instance).asset_materializations_for_node("sources__robust")[0]
    path = Path(first.metadata["path"].value)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    second = _materialize(spec, lead, instance).asset_materializations_for_node("sources__robust")[0]
    assert second.metadata["changed"].value is False
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


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


def test_a_batch_run_collects_every_lead_of_a_partition_range(world) -> None:
    settings, lead, instance, store = world
    others = [normalize_lead("domain", f"batch{i}.example") for i in range(3)]
    for other in others:
        store.add_lead(other, case_id="case-1")
    instance.add_dynamic_partitions("leads", [other.id for other in others])
    spec = load_catalog(settings.sources_path).get("robust")
    result = materialize(
        [build_source_asset(spec)],
        instance=instance,
        tags={"dagster/asset_partition_range_start": lead.id, "dagster/asset_partition_range_end": others[-1].id},
        resources={"fleet": FleetResource()},
    )
    mats = result.asset_materializations_for_node("sources__robust")
    assert sorted(m.partition for m in mats) == sorted([lead.id, *(o.id for o in others)])
    checks = result.get_asset_check_evaluations()
    assert sorted(c.partition for c in checks) == sorted(m.partition for m in mats) and all(c.passed for c in checks)


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
    result = defs.resolve_job_def("check_only").execute_in_process(instance=instance, tags={"dagster/partition": lead.id})
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.metadata["records"].value == 0
    assert sandbox.app_state.sources["quiet"].requests == requests_before


def test_a_batch_run_collects_only_its_member_leads_inside_the_envelope(world) -> None:
    settings, lead, instance, store = world
    others = [normalize_lead("domain", f"member{i}.example") for i in range(3)]
    for other in others:
        store.add_lead(other, case_id="case-1")
    instance.add_dynamic_partitions("leads", [other.id for other in others])
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
        tags={"dagster/asset_partition_range_start": lead.id, "dagster/asset_partition_range_end": others[2].id,
              HANDOVER_TAG: "robust:batch:test"},
    )
    assert sorted(m.partition for m in result.asset_materializations_for_node("sources__robust")) == sorted(members)


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
                         partition_key=lead.id, tags={HANDOVER_TAG: "robust:killed"})
    assert result.success
    assert result.asset_materializations_for_node("sources__robust") == []
    assert sandbox.app_state.sources["robust"].requests == requests_before


def _niceness_after(tags: dict[str, str]) -> int:
    # In a child process: the niceness of a process can only go up, and this one runs the other tests.
    code = ("import json, os, sys; from assets.sources import lower_cpu_priority_if_background as lower; "
            "tags = json.loads(sys.argv[1]); lower(tags); lower(tags); print(os.getpriority(os.PRIO_PROCESS, 0))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(tags)], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])
    return int(done.stdout.strip())


@pytest.mark.parametrize(
    ("tags", "background"),
    [
        (run_tags(PriorityClass.INTERACTIVE), False),
        (run_tags(PriorityClass.RECURRING), True),
        (run_tags(PriorityClass.BACKFILL), True),
        ({"dagster/backfill": "abc"}, True),  # a backfill launched from the UI
    ],
)
def test_a_background_run_worker_gives_up_cpu_priority_once_and_an_interactive_one_keeps_it(
    tags: dict[str, str], background: bool
) -> None:
    inherited = os.getpriority(os.PRIO_PROCESS, 0)
    assert _niceness_after(tags) == (max(inherited, BACKGROUND_NICENESS) if background else inherited)
