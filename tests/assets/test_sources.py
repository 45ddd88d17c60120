"""Source assets materialize a lead's partition against the sandbox web over loopback."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, DagsterInstance, materialize

from assets.sources import build_source_asset
from investigations.catalog import load_catalog
from investigations.config import Settings
from investigations.leads import normalize_lead
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
