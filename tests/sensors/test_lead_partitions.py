"""The `leads` partitions hold the active leads only: a closed case's leads retire, keeping their
history in Dagster's event log and the fleet's stores, and come back when the case re-opens."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, asset, materialize
from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

from assets.partitions import LEADS_PARTITIONS, leads_partitions
from investigations.intake.leads import normalize_lead
from investigations.store import StateStore, utcnow
from resources.dagster_internals import delete_partition_keys
from sensors.lead_partitions import (
    SETTLE,
    add_partitions,
    lifecycle_pass,
    sync_lead_partitions,
    wait_for_carried_status,
)

A, B, C = (normalize_lead("domain", f"{name}.example") for name in ("a", "b", "c"))
RETIRE_AFTER = timedelta(days=7)


@asset(partitions_def=leads_partitions)
def probe() -> int:
    return 1


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        yield instance


def keys(instance: DagsterInstance) -> list[str]:
    return sorted(instance.get_dynamic_partitions(LEADS_PARTITIONS))


def materialized(instance: DagsterInstance) -> list[str]:
    """What the UI's partition status reads: the materialized partitions among the current keys."""
    status = get_and_update_asset_status_cache_value(instance, AssetKey("probe"), leads_partitions)
    assert status is not None
    return sorted(status.deserialize_materialized_partition_subsets(leads_partitions).get_partition_keys())


def settled() -> timedelta:
    return SETTLE + timedelta(minutes=1)


def test_a_closed_case_s_leads_leave_the_partitions_and_keep_their_history(
    instance: DagsterInstance, sqlite_store: StateStore
) -> None:
    sqlite_store.add_leads([A, B], case_id="closing")
    sqlite_store.add_lead(C, case_id="open")
    add_partitions(instance, [A.partition_key, B.partition_key, C.partition_key])
    materialize([probe], partition_key=A.partition_key, instance=instance)
    sqlite_store.set_case_status("closing", "closed")
    now = utcnow() + settled()
    result = lifecycle_pass(instance, sqlite_store, retire_after=RETIRE_AFTER, now=now)
    assert sorted(result.retired) == sorted([A.id, B.id]) and result.revived == []
    assert keys(instance) == [C.partition_key]
    assert sqlite_store.retired_lead_ids([A.id, B.id, C.id]) == {A.id, B.id}
    # Dagster keeps the retired lead's materialization in its event log.
    history = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("probe"),
                                                                 asset_partitions=[A.partition_key]), limit=10)
    assert len(history.records) == 1
    assert materialized(instance) == []
    assert not lifecycle_pass(instance, sqlite_store, retire_after=RETIRE_AFTER, now=now).changed


def test_a_re_opened_case_brings_its_leads_back_with_their_history(
    instance: DagsterInstance, sqlite_store: StateStore
) -> None:
    sqlite_store.add_leads([A, B], case_id="case-1")
    add_partitions(instance, [A.partition_key, B.partition_key])
    materialize([probe], partition_key=A.partition_key, instance=instance)
    assert materialized(instance) == [A.partition_key]
    sqlite_store.set_case_status("case-1", "closed")
    lifecycle_pass(instance, sqlite_store, retire_after=RETIRE_AFTER, now=utcnow() + settled())
    assert keys(instance) == [] and materialized(instance) == []
    sqlite_store.set_case_status("case-1", "active")
    result = lifecycle_pass(instance, sqlite_store, retire_after=RETIRE_AFTER)
    assert sorted(result.revived) == sorted([A.id, B.id]) and result.retired == []
    assert keys(instance) == sorted([A.partition_key, B.partition_key])
    assert materialized(instance) == [A.partition_key]
    assert sqlite_store.lead_partition_counts() == {"active": 2, "retired": 0}


def test_a_pass_cut_short_after_dagster_changed_is_finished_by_the_next(
    instance: DagsterInstance, sqlite_store: StateStore
) -> None:
    sqlite_store.add_lead(A, case_id="case-1")
    add_partitions(instance, [A.partition_key])
    sqlite_store.set_case_status("case-1", "closed")
    instance.delete_dynamic_partition(LEADS_PARTITIONS, A.partition_key)  # removed, but the store not told yet
    result = lifecycle_pass(instance, sqlite_store, retire_after=RETIRE_AFTER, now=utcnow() + settled())
    assert result.retired == [A.id] and sqlite_store.retired_lead_ids([A.id]) == {A.id}


def test_the_sync_adds_neither_a_retired_lead_nor_one_whose_cases_are_closed(
    instance: DagsterInstance, sqlite_store: StateStore
) -> None:
    sqlite_store.add_leads([A, B], case_id="case-1")
    sqlite_store.add_lead(C, case_id="closed")
    sqlite_store.set_case_status("closed", "closed")
    sqlite_store.mark_retired([A.id])
    read, _ = sync_lead_partitions(instance, sqlite_store, since=None)
    assert read == 1 and keys(instance) == [B.partition_key]


def test_a_pass_retires_at_most_its_batch(instance: DagsterInstance, sqlite_store: StateStore) -> None:
    sqlite_store.add_leads([A, B, C], case_id="case-1")
    add_partitions(instance, [A.partition_key, B.partition_key, C.partition_key])
    sqlite_store.set_case_status("case-1", "closed")
    now = utcnow() + settled()
    assert len(lifecycle_pass(instance, sqlite_store, retire_after=RETIRE_AFTER, now=now, batch=2).retired) == 2
    assert len(keys(instance)) == 1
    assert len(lifecycle_pass(instance, sqlite_store, retire_after=RETIRE_AFTER, now=now, batch=2).retired) == 1
    assert keys(instance) == []


class RacedInstance:
    """An instance another tick races: at the first add, the other tick inserts the same keys after
    this one read which exist and before it inserts them, so this insert meets the unique constraint."""

    def __init__(self, real: DagsterInstance) -> None:
        self.real, self.adds = real, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def add_dynamic_partitions(self, name: str, keys: list[str]) -> None:
        self.adds += 1
        if self.adds == 1:
            from dagster._core.storage.event_log.schema import DynamicPartitionsTable

            self.real.add_dynamic_partitions(name, keys)  # the other tick
            with self.real.event_log_storage.index_connection() as conn:  # type: ignore[attr-defined]
                conn.execute(DynamicPartitionsTable.insert(),
                             [{"partitions_def_name": name, "partition": key} for key in keys])
        self.real.add_dynamic_partitions(name, keys)


def test_adding_keys_another_tick_adds_at_the_same_moment_succeeds(instance: DagsterInstance) -> None:
    raced = RacedInstance(instance)
    added = add_partitions(raced, [A.partition_key, B.partition_key])  # type: ignore[arg-type]
    # Its second try finds both keys there: the other tick added them, this one adds nothing.
    assert raced.adds == 1 and added == [] and keys(instance) == sorted([A.partition_key, B.partition_key])


def cached_status(instance: DagsterInstance):
    (record,) = instance.get_asset_records([AssetKey("probe")])
    return record.asset_entry.cached_status


def current_id(instance: DagsterInstance) -> str:
    return leads_partitions.get_serializable_unique_identifier(dynamic_partitions_store=instance)


def test_a_fresh_lead_s_key_carries_the_partition_status_over_instead_of_a_rebuild(instance: DagsterInstance) -> None:
    add_partitions(instance, [A.partition_key])
    materialize([probe], partition_key=A.partition_key, instance=instance)
    assert materialized(instance) == [A.partition_key]  # the status the UI reads, cached for [A]
    before = cached_status(instance)
    assert add_partitions(instance, [A.partition_key, B.partition_key]) == [B.partition_key]
    wait_for_carried_status()
    after = cached_status(instance)
    # Current for the keys now, so the UI's next read does not rebuild it; nothing else changed.
    assert after.partitions_def_id == current_id(instance) != before.partitions_def_id
    assert after._replace(partitions_def_id=before.partitions_def_id) == before
    assert materialized(instance) == [A.partition_key]


def test_a_lead_brought_back_with_its_history_gets_its_status_rebuilt_not_carried(instance: DagsterInstance) -> None:
    add_partitions(instance, [A.partition_key, B.partition_key])
    materialize([probe], partition_key=A.partition_key, instance=instance)
    delete_partition_keys(instance, LEADS_PARTITIONS, [A.partition_key])  # retired
    assert materialized(instance) == []  # the status, cached for [B]
    add_partitions(instance, [A.partition_key])  # brought back
    wait_for_carried_status()
    assert cached_status(instance).partitions_def_id != current_id(instance)  # left to Dagster's rebuild
    assert materialized(instance) == [A.partition_key]


def test_a_status_made_for_other_keys_than_the_ones_before_is_left_to_dagster(instance: DagsterInstance) -> None:
    add_partitions(instance, [A.partition_key, B.partition_key])
    materialize([probe], partition_key=A.partition_key, instance=instance)
    assert materialized(instance) == [A.partition_key]  # cached for [A, B]
    delete_partition_keys(instance, LEADS_PARTITIONS, [B.partition_key])  # the status is not told
    add_partitions(instance, [C.partition_key])
    wait_for_carried_status()
    assert cached_status(instance).partitions_def_id != current_id(instance)
    assert materialized(instance) == [A.partition_key]


def test_on_an_in_memory_instance_the_status_is_carried_before_the_add_returns() -> None:
    with DagsterInstance.ephemeral() as instance:
        add_partitions(instance, [A.partition_key])
        materialize([probe], partition_key=A.partition_key, instance=instance)
        assert materialized(instance) == [A.partition_key]
        add_partitions(instance, [B.partition_key])
        assert cached_status(instance).partitions_def_id == current_id(instance)
