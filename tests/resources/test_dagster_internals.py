"""Dagster's private internals, hook by hook (resources/dagster_internals.py).

Each hook's assumptions about the installed Dagster are checked first, and fail naming the hook when
an upgrade breaks one. Then what each does: a run worker keeps its Dagster storage connections open
for the run while a sensor's resources do not (Postgres: Dagster's own pool switch; SQLite: the
run-sharded event log keeps one engine per file); Dagster's migration scripts are read once per
process, and instances opened from a ref still work."""

from __future__ import annotations

import inspect
import sqlite3.dbapi2
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster
import dagster._core.storage.runs.sqlite.sqlite_run_storage as sqlite_runs
import pytest
import yaml
from alembic.config import Config
from alembic.script import ScriptDirectory
from dagster import (
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    asset,
    build_resources,
    materialize,
)
from dagster._core.storage.event_log.schema import DynamicPartitionsTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.sql import get_alembic_config
from dagster_postgres.event_log import PostgresEventLogStorage
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from resources.dagster_internals import (
    AssetCheckEvaluationTargetMaterializationData,
    AssetCheckExecutionRecordStatus,
    CheckRunHealthResult,
    HeldShards,
    LaunchRunContext,
    UnresolvedAssetJobDefinition,
    WorkerStatus,
    delete_partition_keys,
    hold_connections_for_the_run,
    read_migration_scripts_once,
    remember_asset_key_columns,
)
from resources.fleet import FleetResource
from tests.conftest import POSTGRES_URL, require_postgres

# The Dagster these hooks were last checked against: moving the pin means checking each hook again
# (docs/deploying.md, "Upgrading Dagster"), then this line.
CHECKED_WITH_DAGSTER = "1.13.27"


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def _required(function: object) -> list[str]:
    """The parameters a call must give (those without a default)."""
    return [name for name, parameter in inspect.signature(function).parameters.items()  # type: ignore[arg-type]
            if parameter.default is inspect.Parameter.empty]


def test_the_hooks_were_checked_against_the_installed_dagster() -> None:
    assert dagster.__version__ == CHECKED_WITH_DAGSTER, (
        f"Dagster {dagster.__version__} is installed; the private hooks in resources/dagster_internals.py were "
        f"checked against {CHECKED_WITH_DAGSTER}: check each (docs/deploying.md, Upgrading Dagster), then move "
        "CHECKED_WITH_DAGSTER")


def test_hook_held_connections_finds_dagster_s_pool_switch() -> None:
    assert {"statement_timeout", "pool_recycle", "max_overflow"} <= set(
        _parameters(DagsterInstance.optimize_for_webserver)), "hold_connections_for_the_run: optimize_for_webserver"


def test_hook_asset_key_columns_finds_the_column_check_it_replaces() -> None:
    assert _parameters(SqlEventLogStorage._has_asset_key_col_on_connection) == ["self", "conn", "column_name"], \
        "remember_asset_key_columns: SqlEventLogStorage._has_asset_key_col_on_connection(conn, column_name)"


def test_hook_held_shards_finds_every_sqlite_event_log_member_it_uses() -> None:
    expected = {"_connect": ["self", "shard"], "has_table": ["self", "table_name"], "dispose": ["self"],
                "_initdb": ["self", "engine"], "conn_string_for_shard": ["self", "shard_name"]}
    found = {name: _required(getattr(SqliteEventLogStorage, name, None) or (lambda: None)) for name in expected}
    assert found == expected, "HeldShards: SqliteEventLogStorage's members changed (as Dagster's _connect calls them)"
    assert "_initialized_dbs" in SqliteEventLogStorage.__init__.__code__.co_names or \
        "_initialized_dbs" in inspect.getsource(SqliteEventLogStorage), "HeldShards: _initialized_dbs"
    assert "_db_lock" in inspect.getsource(SqliteEventLogStorage), "HeldShards: _db_lock"


def test_hook_migration_scripts_finds_alembic_s_script_directory_builder() -> None:
    assert isinstance(ScriptDirectory.__dict__["from_config"], classmethod), \
        "read_migration_scripts_once: ScriptDirectory.from_config is no longer a classmethod"
    location = get_alembic_config(sqlite_runs.__file__).get_alembic_option("script_location")
    assert location and location.startswith("dagster:"), \
        f"read_migration_scripts_once: Dagster's script location is {location!r}, not a dagster: resource"


def test_hook_partition_keys_finds_the_statement_and_connection_dagster_deletes_a_key_with() -> None:
    source = inspect.getsource(SqlEventLogStorage.delete_dynamic_partition)
    assert "DynamicPartitionsTable.delete()" in source and "index_connection" in source, \
        "delete_partition_keys: Dagster no longer deletes a partition key from DynamicPartitionsTable"
    assert {"partitions_def_name", "partition"} <= set(DynamicPartitionsTable.c.keys()), \
        "delete_partition_keys: DynamicPartitionsTable lost a column the hook filters on"
    for storage in (SqliteEventLogStorage, PostgresEventLogStorage):
        assert _parameters(storage.index_connection) == ["self"], \
            f"delete_partition_keys: {storage.__name__}.index_connection changed"


def test_hook_partition_status_finds_the_function_the_ui_rebuilds_a_status_with() -> None:
    from dagster._core.storage.partition_status_cache import (
        AssetStatusCacheValue,
        get_and_update_asset_status_cache_value,
    )

    assert _required(get_and_update_asset_status_cache_value) == ["instance", "asset_key", "partitions_def"], \
        "warm_partition_status: get_and_update_asset_status_cache_value's parameters changed"
    assert "partitions_def_id" in AssetStatusCacheValue._fields, \
        "warm_partition_status: the status cache no longer names the partition keys it was made for"


def test_hook_carried_status_finds_the_identifier_dagster_gives_the_keys_and_its_lookup_by_partition() -> None:
    from dagster._core.definitions.partitions.utils.base import generate_partition_key_based_definition_id

    from assets.partitions import LEADS_PARTITIONS, leads_partitions

    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(LEADS_PARTITIONS, ["lead-b", "lead-a"])
        assert generate_partition_key_based_definition_id(["lead-b", "lead-a"]) == \
            leads_partitions.get_serializable_unique_identifier(dynamic_partitions_store=instance), \
            "carry_partition_status: a status's identifier is no longer the hash of the keys in the order added"
    assert {"asset_key", "event_type", "partitions"} <= set(_parameters(SqlEventLogStorage.get_latest_storage_id_by_partition)), \
        "carry_partition_status: the latest event by partition can no longer be asked for some partitions"


def test_hook_execute_run_here_finds_the_body_of_dagster_s_execute_run_command() -> None:
    from dagster._cli.api import _execute_run_command_body, execute_run_command

    assert _required(_execute_run_command_body) == ["run_id", "instance", "write_stream_fn", "set_exit_code_on_failure"], \
        "execute_run_here: _execute_run_command_body's parameters changed"
    assert "_execute_run_command_body(" in inspect.getsource(execute_run_command.callback), \
        "execute_run_here: `dagster api execute_run` no longer runs a run through _execute_run_command_body"


def test_the_private_types_are_still_where_they_are_imported_from() -> None:
    assert AssetCheckExecutionRecordStatus.FAILED.value == "FAILED"
    assert {"storage_id", "run_id", "timestamp"} <= set(AssetCheckEvaluationTargetMaterializationData._fields)
    assert isinstance(dagster.define_asset_job("probe"), UnresolvedAssetJobDefinition)
    assert {"dagster_run", "workspace"} <= set(LaunchRunContext._fields)
    assert {"status", "msg", "run_worker_id"} <= set(CheckRunHealthResult._fields)
    assert {WorkerStatus.RUNNING.value, WorkerStatus.FAILED.value} == {"RUNNING", "FAILED"}


def _admin(sql: str, **params: object) -> list[tuple]:
    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.execute(text(sql), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _backends(db: str) -> int:
    """Connections to `db` open on the server now (other than the one asking)."""
    return _admin("SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()", db=db)[0][0]


@pytest.fixture
def pg_instance(tmp_path: Path) -> Iterator[tuple[DagsterInstance, str]]:
    """A Dagster instance whose runs, events and schedules are in a fresh Postgres database."""
    require_postgres()
    db = f"dagster_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{db}"')
    url = make_url(POSTGRES_URL).set(database=db).render_as_string(hide_password=False)
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"postgres": {"postgres_url": url}}}))
    instance = DagsterInstance.from_config(str(tmp_path))
    try:
        yield instance, db
    finally:
        instance.dispose()
        _admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


@asset
def uses_the_fleet(fleet: FleetResource) -> None:
    fleet.settings()


@pytest.mark.postgres
def test_a_run_leaves_its_storage_connection_open_between_writes(pg_instance, sandbox_env) -> None:
    instance, db = pg_instance
    assert _backends(db) == 0  # Dagster's default: a connection per write, none held between them
    assert materialize([uses_the_fleet], instance=instance, resources={"fleet": FleetResource()}).success
    held = _backends(db)
    assert held >= 1
    instance.report_runless_asset_event(AssetMaterialization("after_the_run"))
    assert _backends(db) == held  # the next write went over a held connection, not a new one


@pytest.mark.postgres
def test_resources_built_outside_a_run_leave_the_instance_as_it_was(pg_instance, sandbox_env) -> None:
    instance, db = pg_instance
    with build_resources({"fleet": FleetResource()}, instance=instance) as resources:
        resources.fleet.settings()
    instance.report_runless_asset_event(AssetMaterialization("from_a_sensor"))
    assert _backends(db) == 0


@pytest.mark.postgres
def test_switching_an_instance_twice_does_it_once(pg_instance) -> None:
    instance, _ = pg_instance
    assert hold_connections_for_the_run(instance) is True
    assert hold_connections_for_the_run(instance) is False
    assert hold_connections_for_the_run(None) is False


@pytest.mark.postgres
def test_after_the_server_drops_the_held_connection_at_most_one_write_fails(pg_instance, sandbox_env) -> None:
    instance, db = pg_instance
    assert materialize([uses_the_fleet], instance=instance, resources={"fleet": FleetResource()}).success
    _admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()",
           db=db)
    failures = 0
    for attempt in range(3):
        try:
            instance.report_runless_asset_event(AssetMaterialization(f"after_restart_{attempt}"))
        except Exception:  # the dead connection's one error, as a write during the outage would fail
            failures += 1
    assert failures <= 1
    assert instance.get_latest_materialization_event(AssetMaterialization("after_restart_2").asset_key) is not None


# -- SQLite: Dagster's run-sharded event log ------------------------------------------------------

EVENTS = 60


@pytest.fixture
def sqlite_instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    """A Dagster instance on its default storage: SQLite files under its home, one per run."""
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = DagsterInstance.from_config(str(tmp_path))
    try:
        yield instance
    finally:
        instance.dispose()


@pytest.fixture
def connections_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every SQLite connection opened to a file of the instance's event log (its runs' files and
    the index), as it is opened. The run storage's few per run are not counted."""
    opened: list[str] = []
    connect = sqlite3.dbapi2.connect  # what SQLAlchemy's pysqlite dialect calls
    event_log = tmp_path / "history" / "runs"

    def counting(database, *args, **kwargs):
        if Path(database).parent == event_log:
            opened.append(str(database))
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3.dbapi2, "connect", counting)
    return opened


@asset
def notes_events(context, fleet: FleetResource) -> None:
    """Logs EVENTS materializations of another asset, as a batch run logs one per lead."""
    fleet.settings()
    for n in range(EVENTS):
        context.log_event(AssetMaterialization("noted", partition=None, metadata={"n": n}))


def test_a_sqlite_run_writes_its_events_over_held_connections(sqlite_instance, connections_opened, sandbox_env) -> None:
    assert materialize([notes_events], instance=sqlite_instance, resources={"fleet": FleetResource()}).success
    # Dagster's default opens two or three per event (the run's file, the index); held, a handful in all.
    assert 0 < len(connections_opened) < EVENTS // 2


def test_a_sqlite_run_s_events_are_committed_for_every_other_reader(sqlite_instance, tmp_path, sandbox_env) -> None:
    assert materialize([notes_events], instance=sqlite_instance, resources={"fleet": FleetResource()}).success
    reader = DagsterInstance.from_config(str(tmp_path))
    try:
        records = reader.fetch_materializations(AssetKey("noted"), limit=EVENTS + 1).records
        assert sorted(record.asset_materialization.metadata["n"].value for record in records) == list(range(EVENTS))
    finally:
        reader.dispose()


def test_sqlite_resources_built_outside_a_run_keep_a_connection_per_write(
    sqlite_instance, connections_opened, sandbox_env
) -> None:
    with build_resources({"fleet": FleetResource()}, instance=sqlite_instance) as resources:
        resources.fleet.settings()
    before = len(connections_opened)
    for n in range(3):
        sqlite_instance.report_runless_asset_event(AssetMaterialization("from_a_sensor", metadata={"n": n}))
    assert len(connections_opened) - before >= 3


def test_held_sqlite_files_are_bounded_and_closed_with_the_instance(sqlite_instance) -> None:
    storage = sqlite_instance.event_log_storage
    held = HeldShards(storage, max_shards=2)
    held.install()
    for shard in ["run-a", "run-b", "run-c", "run-b"]:
        with storage.run_connection(shard) as conn:
            conn.execute(text("SELECT 1"))
    assert held.shards == ["run-c", "run-b"]  # run-a, the least recently used, was closed
    sqlite_instance.dispose()
    assert held.shards == []


def _synchronous(storage, shard: str) -> int:
    with storage.run_connection(shard) as conn:
        return conn.execute(text("PRAGMA synchronous")).scalar_one()


def test_held_sqlite_files_in_wal_mode_commit_without_a_flush_each(sqlite_instance) -> None:
    storage = sqlite_instance.event_log_storage
    HeldShards(storage).install()
    # A run's file created by this process (Dagster puts it in WAL mode at its first use).
    assert _synchronous(storage, "run-new") == 1  # NORMAL


def test_a_held_sqlite_file_not_in_wal_mode_keeps_sqlite_s_default(sqlite_instance, tmp_path) -> None:
    storage = sqlite_instance.event_log_storage
    rollback = sqlite3.dbapi2.connect(tmp_path / "history" / "runs" / "run-old.db")
    rollback.execute("PRAGMA journal_mode=DELETE")
    rollback.close()
    storage._initialized_dbs.add("run-old")  # as a file this process already met
    HeldShards(storage).install()
    assert _synchronous(storage, "run-old") == 2  # FULL


def test_an_asset_key_column_found_is_asked_for_once_and_a_missing_one_each_time(sqlite_instance) -> None:
    storage = sqlite_instance.event_log_storage
    asked: list[str] = []
    has_column = storage._has_asset_key_col_on_connection

    def counting(conn, column_name: str) -> bool:
        asked.append(column_name)
        return column_name != "not_yet" and has_column(conn, column_name)

    storage._has_asset_key_col_on_connection = counting
    remember_asset_key_columns(storage)
    for n in range(5):
        sqlite_instance.report_runless_asset_event(AssetMaterialization("noted", metadata={"n": n}))
    assert asked == ["last_materialization_timestamp"]
    with storage.index_connection() as conn:
        assert not storage._has_asset_key_col_on_connection(conn, "not_yet")
        assert not storage._has_asset_key_col_on_connection(conn, "not_yet")
    assert asked.count("not_yet") == 2


# -- Dagster's migration scripts, read once per process -------------------------------------------


def test_dagster_script_directories_are_built_once_and_others_each_time(tmp_path: Path) -> None:
    read_migration_scripts_once()
    read_migration_scripts_once()  # idempotent: not wrapped twice
    dagster_config = get_alembic_config(sqlite_runs.__file__)
    assert ScriptDirectory.from_config(dagster_config) is ScriptDirectory.from_config(dagster_config)
    (tmp_path / "versions").mkdir()
    other = Config()
    other.set_main_option("script_location", str(tmp_path))
    assert ScriptDirectory.from_config(other) is not ScriptDirectory.from_config(other)


def test_an_instance_opened_from_its_ref_still_reads_and_writes(tmp_path: Path) -> None:
    read_migration_scripts_once()
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        ref = instance.get_ref()
        instance.add_dynamic_partitions("leads", ["a"])
    for _ in range(2):
        with DagsterInstance.from_ref(ref) as again:
            assert again.get_dynamic_partitions("leads") == ["a"]


def _keys_left_after_deleting(instance: DagsterInstance) -> tuple[list[str], list[str]]:
    instance.add_dynamic_partitions("leads", [f"lead-{n}" for n in range(1_200)])
    instance.add_dynamic_partitions("other", ["lead-1"])
    delete_partition_keys(instance, "leads", [f"lead-{n}" for n in range(1, 1_200)] + ["never-added"])
    return instance.get_dynamic_partitions("leads"), instance.get_dynamic_partitions("other")


def test_partition_keys_are_deleted_in_bulk_on_sqlite_and_only_those_of_their_definition(sqlite_instance) -> None:
    assert _keys_left_after_deleting(sqlite_instance) == (["lead-0"], ["lead-1"])


@pytest.mark.postgres
def test_partition_keys_are_deleted_in_bulk_on_postgres_and_only_those_of_their_definition(pg_instance) -> None:
    instance, _ = pg_instance
    assert _keys_left_after_deleting(instance) == (["lead-0"], ["lead-1"])


def test_partition_keys_deleted_on_an_in_memory_instance_go_through_dagster_s_own_method() -> None:
    with DagsterInstance.ephemeral() as instance:
        assert _keys_left_after_deleting(instance) == (["lead-0"], ["lead-1"])
