"""Source-level checks: a silently empty source fails them in Dagster's own check records."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetCheckKey, AssetCheckSeverity, DagsterInstance, materialize

from assets.health import SOURCE_HEALTH_JOB, source_check_specs
from assets.naming import EMPTY_CHECK_NAME, SOURCE_CHECK_NAMES, source_asset_key
from assets.sources import build_source_asset
from definitions import build_definitions
from investigations.config import Settings
from investigations.intake.leads import normalize_lead
from investigations.sources.catalog import load_catalog
from investigations.store import StateStore
from resources.fleet import FleetResource


@pytest.fixture
def world(sandbox_env: Path):
    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    catalog = load_catalog(settings.sources_path)
    instance = DagsterInstance.ephemeral()
    yield settings, catalog, store, instance
    store.close()


def _collect(catalog, instance, source: str, lead) -> None:
    instance.add_dynamic_partitions("leads", [lead.id])
    result = materialize([build_source_asset(catalog.get(source))], partition_key=lead.id, instance=instance,
                         resources={"fleet": FleetResource()})
    assert result.success


def _latest(instance: DagsterInstance, source: str, name: str):
    key = AssetCheckKey(source_asset_key(source), name)
    record = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    return record.event.dagster_event.event_specific_data


def test_a_silently_empty_source_fails_freshness_and_its_canary_while_a_steady_one_passes(world) -> None:
    settings, catalog, store, instance = world
    lead = normalize_lead("domain", "example.com")
    store.add_lead(lead, case_id="case-1")
    for source in ("robust", "quiet"):
        _collect(catalog, instance, source, lead)
        canary = catalog.get(source).canaries[0].lead
        store.add_lead(canary)
        _collect(catalog, instance, source, canary)
    result = build_definitions(settings).resolve_job_def(SOURCE_HEALTH_JOB).execute_in_process(instance=instance)
    assert result.success
    fresh, canaries = SOURCE_CHECK_NAMES["fresh"], SOURCE_CHECK_NAMES["canaries"]
    quiet_fresh = _latest(instance, "quiet", fresh)
    assert not quiet_fresh.passed and quiet_fresh.severity == AssetCheckSeverity.ERROR
    assert quiet_fresh.metadata["fresh_share"].value == 0.0 and quiet_fresh.metadata["monitored_leads"].value == 1
    quiet_canary = _latest(instance, "quiet", canaries)
    assert not quiet_canary.passed and "canary.example" in quiet_canary.metadata["examples"].value[0]
    assert _latest(instance, "robust", fresh).passed and _latest(instance, "robust", canaries).passed


def test_a_canary_check_with_nothing_collected_yet_is_not_reported_passed(world) -> None:
    settings, catalog, store, instance = world
    result = build_definitions(settings).resolve_job_def(SOURCE_HEALTH_JOB).execute_in_process(instance=instance)
    assert result.success
    canaries, fresh = SOURCE_CHECK_NAMES["canaries"], SOURCE_CHECK_NAMES["fresh"]
    keys = [AssetCheckKey(source_asset_key(spec.name), name) for spec in catalog.sources if spec.canaries
            for name in (canaries, fresh)]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    evaluated = [key for key, record in latest.items() if record.event is not None
                 and record.event.dagster_event is not None
                 and record.event.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert keys and evaluated == []  # no canary collected, no lead monitored: nothing reads Passed


def test_a_source_job_runs_the_per_lead_check_and_not_the_source_level_ones(world) -> None:
    settings, catalog, _, _ = world
    defs = build_definitions(settings)
    checks = defs.resolve_job_def("collect_quiet").asset_layer.asset_graph.asset_check_keys
    assert checks == {AssetCheckKey(source_asset_key("quiet"), EMPTY_CHECK_NAME)}
    health = defs.resolve_job_def(SOURCE_HEALTH_JOB).asset_layer.asset_graph.asset_check_keys
    assert health == {spec.key for spec in source_check_specs(catalog)}
    assert not [key for key in health if key.name == SOURCE_CHECK_NAMES["canaries"] and key.asset_key.path[-1] == "slow"]
