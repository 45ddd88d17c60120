"""Each source's partition status is rebuilt in the background once the `leads` keys change, so the
UI reads a current one instead of rebuilding it while the operator waits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import AssetMaterialization, DagsterInstance, SkipReason, build_sensor_context

from assets.naming import source_asset_key
from assets.partitions import LEADS_PARTITIONS, leads_partitions
from investigations.sources.specs import load_sources
from sensors.partition_status import build_partition_status_sensor

ROOT = Path(__file__).resolve().parents[2]
ROBUST = source_asset_key("robust")


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        yield instance


def stored(instance: DagsterInstance):
    (record,) = instance.get_asset_records([ROBUST])
    return record.asset_entry.cached_status


def current_id(instance: DagsterInstance) -> str:
    return leads_partitions.get_serializable_unique_identifier(dynamic_partitions_store=instance)


def evaluate(sensor, instance: DagsterInstance, cursor: str | None = None):
    with build_sensor_context(instance=instance, cursor=cursor) as context:
        return sensor(context)


def test_a_change_of_keys_gets_each_materialized_source_s_status_rebuilt_for_the_new_keys(
    instance: DagsterInstance,
) -> None:
    sensor = build_partition_status_sensor(load_sources(ROOT / "sources.yaml"))
    instance.add_dynamic_partitions(LEADS_PARTITIONS, ["lead-a", "lead-b"])
    instance.report_runless_asset_event(AssetMaterialization(ROBUST, partition="lead-a"))
    first = evaluate(sensor, instance)
    assert first.cursor == current_id(instance)
    assert stored(instance).partitions_def_id == current_id(instance)
    assert "rebuilt for 1 source(s)" in first.skip_reason.skip_message  # the others never materialized
    instance.add_dynamic_partitions(LEADS_PARTITIONS, ["lead-c"])
    assert stored(instance).partitions_def_id != current_id(instance)  # stale: the UI would rebuild it
    second = evaluate(sensor, instance, cursor=first.cursor)
    status = stored(instance)
    assert second.cursor == current_id(instance) and status.partitions_def_id == current_id(instance)
    assert status.deserialize_materialized_partition_subsets(leads_partitions).get_partition_keys() == {"lead-a"}


def test_unchanged_keys_are_not_warmed_again(instance: DagsterInstance) -> None:
    sensor = build_partition_status_sensor(load_sources(ROOT / "sources.yaml"))
    instance.add_dynamic_partitions(LEADS_PARTITIONS, ["lead-a"])
    instance.report_runless_asset_event(AssetMaterialization(ROBUST, partition="lead-a"))
    first = evaluate(sensor, instance)
    again = evaluate(sensor, instance, cursor=first.cursor)
    assert isinstance(again, SkipReason) and "unchanged" in (again.skip_message or "")
