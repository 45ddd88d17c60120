"""Every use of Dagster's private internals, in one module: what each replaces, the gain measured
that keeps it, and the assumption a Dagster upgrade may break. `tests/resources/test_dagster_internals.py`
checks each assumption against the installed Dagster and fails, naming the hook, when one no longer
holds; docs/deploying.md ("Upgrading Dagster") lists them for whoever moves the pin.

Hooks (behaviour replaced):
1. `hold_connections_for_the_run`: a run worker's Dagster storage connections held for the run
   (Postgres: Dagster's own `optimize_for_webserver` switch; SQLite: `HeldShards` in place of the
   event log's `_connect`, `has_table` and `dispose`; both: the asset-key column check of
   `SqlEventLogStorage._has_asset_key_col_on_connection` remembered). Gain: per lead of a 300-lead
   batch, Postgres 15.6 -> 8.8 ms of the main thread's CPU (server 48 -> 7 ms); SQLite 26-32 -> 12 ms.
2. `read_migration_scripts_once`: alembic's `ScriptDirectory.from_config` keeps Dagster's script
   directories for the process. Gain: over half the code server's CPU on the product bench (about
   35 ms per sensor tick on SQLite, two ticks a second).
3. `delete_partition_keys`: many keys of a dynamic partitions definition removed with the statement
   of Dagster's `delete_dynamic_partition` (its `DynamicPartitionsTable`, over the event log's
   `index_connection`), one statement per chunk of keys in one connection, instead of one
   connection per key. Gain: removing 5,000 keys on SQLite, 14.3 s -> about 0.1 s (docs/design.md,
   "A million leads").
4. `warm_partition_status`: Dagster's partition status cache of an asset (what the UI's catalog
   and an asset's page read its materialized, failed and in-progress partitions from) rebuilt in the
   background, with the function the UI's own queries call (`get_and_update_asset_status_cache_value`),
   right after the `leads` partition keys changed. The cache is keyed by a hash of every key, so each
   new lead had the next UI view rebuild every source's status while the operator waited. Gain: at
   100,000 active leads, the catalog's GraphQL p95 of 10 views 4.24 s (its first view) -> 1.56-1.86 s
   (docs/benchmarks.md, "A million leads").

5. `execute_run_here`: what `dagster api execute_run` does with a run (its `_execute_run_command_body`),
   in a worker that `resources.run_launcher.WarmRunLauncher` forked from a process that had imported
   Dagster, the definitions' libraries and the definitions themselves already (the definitions
   kept while current: resources/warm_definitions.py), instead of a fresh Python that imports them
   all for each run. Gain: 1.5-2 s of CPU per run start (docs/benchmarks.md, "A fresh single lead"),
   and about 1 s more with the definitions ("The definitions imported once").

6. `carry_partition_status`: a source's partition status cache moved over to the `leads` keys
   that only grew by keys with no history (a fresh lead's), instead of rebuilt from the event log:
   a cached status is exactly right for such keys, only its identifier (a hash of every key) is
   out of date. `existing_partition_keys` reads which of some keys a dynamic partitions definition
   has, with the statement Dagster's `add_dynamic_partitions` reads them with. Gain: the UI's first
   view after a fresh lead joined no longer rebuilds every source's status while the operator waits;
   at 100,000 keys and 10 sources, 0.4-0.6 s in a thread instead of 6.2-7.7 s of rebuild (engine
   level); on the product, the catalog's GraphQL right after fresh leads joined 2.8-3.3 s instead of
   4.3-6.5 s (docs/benchmarks.md, "A fresh lead's key carries the partition status over").

Private names imported for their types only (no behaviour replaced; Dagster exports no public name):
`UnresolvedAssetJobDefinition` (what `define_asset_job` returns), `LaunchRunContext`,
`CheckRunHealthResult`, `WorkerStatus` and `ConfigurableClassData` (a run launcher's arguments,
answers and configuration, as Dagster's own launchers import them), `AssetCheckEvaluationTargetMaterializationData`
(a check result naming the materialization it judges), `AssetCheckExecutionRecordStatus` (a check's
latest status as the instance reports it), `InstanceRef` (what an instance is opened again from).


## Held storage connections

A run worker keeps its Dagster storage connections open for the run, instead of one per write.

Dagster's storages open a new database connection for every statement group (a `NullPool`), so
that the many short-lived instances of the code server hold nothing between ticks. A run worker is
the opposite case: one process, one instance, one run, writing a materialization and a check result
for every lead of its batch, each event two or three transactions (the run's own event log and the
index the UI reads).

Postgres. Each event opened two to four fresh connections (TCP, authentication, a new server
backend). Measured on a 300-lead batch run in one process (state and Dagster's storage on Postgres):
per lead, 15.6 ms of the main thread's CPU and 48 ms of the server's with a connection per write;
8.8 ms and 7 ms with the connections held, in half the wall time. Dagster has the switch for this:
`DagsterInstance.optimize_for_webserver`, which its webserver calls for its own long-lived instance,
gives each Postgres storage a small pool that keeps one connection open (`pool_size` 1, up to
`MAX_OVERFLOW` more under load, recycled after `POOL_RECYCLE_S`). The statement timeout stays off
(0), as it is with a connection per write: a run's writes are not a webserver's interactive reads.

SQLite. Dagster's run-sharded event log (one file per run, and an index file) has no such switch:
every write builds a new SQLAlchemy engine for its file, opens it, and drops both, and every event
of a check asks SQLite whether the check tables exist, through another new engine. A run worker's
event log instead keeps one engine per file it writes (`HeldShards`: the run's own and the index,
at most `MAX_HELD_SHARDS`, the least recently used dropped) with one connection open, and
remembers a table once it exists. Everything else is Dagster's: the same lock around each
transaction, the same first-use initialisation of a file, the same transactions and busy timeout. An
idle SQLite connection holds no lock (the files are in WAL mode), so other processes are not held
up. Measured on the same 300-lead batch in one process, on SQLite: per lead, the main thread's CPU
26-32 -> 12 ms, the process's 40-50 -> 28 ms; the run's wall time 12-15 -> 8 s.

Two more per-event costs are cut for a run. The held files commit with `synchronous=NORMAL` when
they are in WAL mode (as Dagster creates them, and as the fleet's own state store runs): a commit
is not flushed to disk by itself, the WAL is at its checkpoints, so a killed run worker loses
nothing it committed and only a power cut may lose the last commits. Measured with 2,000 small
commits to a WAL file on local ext4: about 0.09 ms of CPU each flushed, 0.02 ms not; a lead's
events make five. And every materialization asks whether the asset-key table has its index
columns, through a fresh schema inspector (SQLite and Postgres alike): a column found is
remembered for the run.

Only a run's instance is switched, once: a sensor's tick builds resources on an instance of its own
that lives for one tick, and a pool there would hold a connection per tick until it is collected.
After a Postgres restart the held connection is dead; SQLAlchemy drops the pool at the first error
on it, and that write fails as a write during the outage would have failed anyway.


## Dagster's migration scripts, read once per process

Dagster's migration scripts, read once per process instead of at every instance opened.

Dagster opens a new `DagsterInstance` for every sensor tick the code server evaluates (the tick's
context builds one from its instance ref as soon as the sensor uses a resource, a logger or the
instance), and each opening checks the schema revision of every SQL storage. That check asks
alembic for the head revision of the storage's migration scripts, and alembic answers by loading
each script file (about 90 Python files per storage) every time. Profiled on the product bench, that
was over half the code server's CPU: about 35 ms per tick on SQLite, two ticks a second.

The scripts are part of the installed Dagster: they cannot change while the process runs. So the
first `ScriptDirectory` alembic builds for one of Dagster's script locations is kept and handed out
again; its revision map is built once. Only Dagster's own locations are kept; any other alembic use
in the process is left as it was. The database's own revision is still read at every opening, so an
instance whose database is behind the scripts is still refused as before.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import coerce_resource_to_filename
from dagster import AssetKey, DagsterEventType, DagsterInstance, PartitionsDefinition
from dagster._cli.api import _execute_run_command_body
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.partitions.utils.base import generate_partition_key_based_definition_id
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import DynamicPartitionsTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    SqliteEventLogStorage,
)
from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value
from dagster._serdes import ConfigurableClassData
from dagster._utils.interrupts import capture_interrupts
from sqlalchemy import Connection, Engine, and_, create_engine, event, select

__all__ = [
    "AssetCheckEvaluationTargetMaterializationData",
    "AssetCheckExecutionRecordStatus",
    "CheckRunHealthResult",
    "ConfigurableClassData",
    "HeldShards",
    "InstanceRef",
    "LaunchRunContext",
    "UnresolvedAssetJobDefinition",
    "WorkerStatus",
    "carry_partition_status",
    "delete_partition_keys",
    "execute_run_here",
    "existing_partition_keys",
    "warm_partition_status",
    "hold_connections_for_the_run",
    "read_migration_scripts_once",
    "remember_asset_key_columns",
]

# -- 1. held storage connections ------------------------------------------------------------------

STATEMENT_TIMEOUT_MS = 0  # no statement timeout, as with Dagster's connection per write
POOL_RECYCLE_S = 3600
MAX_OVERFLOW = 4
# SQLite files a run worker's event log keeps open: the index and the run's own, with room to spare
# (a run reads another run's file only now and then: an evicted one is opened again when needed).
MAX_HELD_SHARDS = 4

_lock = threading.Lock()
_held: weakref.WeakSet[DagsterInstance] = weakref.WeakSet()


def hold_connections_for_the_run(instance: DagsterInstance | None) -> bool:
    """Switch a run's instance to held connections (idempotent); True when this call switched it."""
    if instance is None:
        return False
    with _lock:
        if instance in _held:
            return False
        _held.add(instance)
    instance.optimize_for_webserver(statement_timeout=STATEMENT_TIMEOUT_MS, pool_recycle=POOL_RECYCLE_S,
                                    max_overflow=MAX_OVERFLOW)
    storage = instance.event_log_storage
    if isinstance(storage, SqlEventLogStorage):
        remember_asset_key_columns(storage)
    # The exact class: a subclass (or the consolidated SQLite log) connects in its own way.
    if type(storage) is SqliteEventLogStorage:
        HeldShards(storage).install()
    return True


def remember_asset_key_columns(storage: SqlEventLogStorage) -> None:
    """Ask the database for a column of the asset-key table once per run, not once per event.

    Every materialization asks whether the asset-key table has its index columns, and Dagster asks
    through a fresh schema inspector each time: a `PRAGMA table_info` on SQLite, a catalog query on
    Postgres. A column, once there, stays (Dagster's migrations add columns), so a column found is
    remembered; one missing is asked about again."""
    ask = storage._has_asset_key_col_on_connection
    found: set[str] = set()

    def has_column(conn: Connection, column_name: str) -> bool:
        if column_name in found:
            return True
        if ask(conn, column_name):
            found.add(column_name)
            return True
        return False

    # A deliberate patch of this storage's method (mypy refuses any assignment to a method).
    storage._has_asset_key_col_on_connection = has_column  # type: ignore[method-assign]


def _normal_sync_in_wal(dbapi_connection: Any, _record: Any) -> None:
    """`synchronous=NORMAL` on a file in WAL mode: a commit is not flushed to disk on its own,
    the WAL is at each checkpoint. A crash of the process loses nothing committed; a power cut may
    lose the last commits, never the file. A file not in WAL keeps SQLite's default."""
    cursor = dbapi_connection.cursor()
    try:
        (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() == "wal":
            cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


class HeldShards:
    """The engines of a run-sharded SQLite event log, one per file, kept open for the run.

    `connect(shard)` stands in for the storage's own `_connect`: it takes the storage's lock, opens
    the file's engine the first time (initialising the file as Dagster does), and yields a
    connection inside a transaction, which commits on the way out.
    """

    def __init__(self, storage: SqliteEventLogStorage, *, max_shards: int = MAX_HELD_SHARDS) -> None:
        self._storage = storage
        self._max_shards = max_shards
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._tables: set[str] = set()
        self._has_table = storage.has_table
        self._dispose = storage.dispose

    def install(self) -> None:
        """Put the held connections in place of the storage's connection per write."""
        storage = self._storage
        # Deliberate patches of this storage's methods (mypy refuses any assignment to a method).
        storage._connect = self.connect  # type: ignore[method-assign]
        storage.has_table = self.has_table  # type: ignore[method-assign]
        storage.dispose = self.dispose  # type: ignore[method-assign]

    @property
    def shards(self) -> list[str]:
        """The files held open, least recently used first."""
        return list(self._engines)

    @contextmanager
    def connect(self, shard: str) -> Iterator[Connection]:
        storage = self._storage
        with storage._db_lock:
            engine = self._engines.get(shard)
            if engine is None:
                engine = self._open(shard)
            else:
                self._engines.move_to_end(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def has_table(self, table_name: str) -> bool:
        """Whether the index has the table; once it has, it keeps it (asked once per check event)."""
        if table_name in self._tables:
            return True
        found = self._has_table(table_name)
        if found:
            self._tables.add(table_name)
        return found

    def dispose(self) -> None:
        """Close the held files, then whatever the storage itself closes."""
        with self._storage._db_lock:
            while self._engines:
                self._engines.popitem(last=False)[1].dispose()
        self._dispose()

    def _open(self, shard: str) -> Engine:
        storage = self._storage
        engine = create_engine(storage.conn_string_for_shard(shard), pool_size=1, max_overflow=MAX_OVERFLOW,
                               connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False})
        event.listen(engine, "connect", _normal_sync_in_wal)
        if shard not in storage._initialized_dbs:
            storage._initdb(engine)
            storage._initialized_dbs.add(shard)
            # Dagster's first use may have only now put the file in WAL mode (a file it created):
            # the held connection is opened again, so that `_normal_sync_in_wal` sees the mode.
            engine.dispose()
        self._engines[shard] = engine
        while len(self._engines) > self._max_shards:
            self._engines.popitem(last=False)[1].dispose()
        return engine


# -- 2. Dagster's migration scripts, read once per process ---------------------------------------

DAGSTER_DIR = Path(dagster.__file__).resolve().parent
_scripts_lock = threading.Lock()
_scripts: dict[str, ScriptDirectory] = {}
_original: Any = None


def read_migration_scripts_once() -> None:
    """Keep the script directory of each of Dagster's storages for the life of the process (idempotent)."""
    global _original
    with _scripts_lock:
        if _original is not None:
            return
        _original = ScriptDirectory.__dict__["from_config"]
        # A deliberate patch of alembic's classmethod: mypy refuses assigning to a method (method-assign),
        # and sees a `classmethod` object where the attribute is declared a callable (assignment).
        ScriptDirectory.from_config = classmethod(_from_config)  # type: ignore[method-assign, assignment]


def _from_config(cls: type[ScriptDirectory], config: Config) -> ScriptDirectory:
    location = config.get_alembic_option("script_location")
    build = _original.__get__(None, cls)
    # Dagster names its locations as package resources ("dagster:_core/storage/alembic").
    if not location or not Path(coerce_resource_to_filename(location)).resolve().is_relative_to(DAGSTER_DIR):
        return build(config)
    with _scripts_lock:
        script = _scripts.get(location)
        if script is None:
            script = build(config)
            script.get_heads()  # the revision map is built here, under the lock, not by two threads at once
            _scripts[location] = script
        return script


# -- 3. partition keys removed in bulk ------------------------------------------------------------

DELETE_CHUNK = 500  # keys per DELETE: well under SQLite's bound variables


def delete_partition_keys(instance: DagsterInstance, partitions_def_name: str, keys: Sequence[str]) -> None:
    """Remove `keys` from a dynamic partitions definition (a key not there is skipped, as Dagster's
    `delete_dynamic_partition` skips it). Dagster's method removes one key per connection and
    transaction; this runs the same statement over a chunk of keys at a time, in one connection. Only
    the partitions table is touched, as with Dagster's: materializations and check results stay in the
    event log. A storage that is not Dagster's SQL event log gets Dagster's method, key by key."""
    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        for key in keys:
            instance.delete_dynamic_partition(partitions_def_name, key)
        return
    with storage.index_connection() as conn:
        for start in range(0, len(keys), DELETE_CHUNK):
            conn.execute(DynamicPartitionsTable.delete().where(and_(
                DynamicPartitionsTable.c.partitions_def_name == partitions_def_name,
                DynamicPartitionsTable.c.partition.in_(list(keys[start:start + DELETE_CHUNK])),
            )))


def existing_partition_keys(instance: DagsterInstance, partitions_def_name: str, keys: Sequence[str]) -> set[str]:
    """Which of `keys` the dynamic partitions definition has: Dagster's `add_dynamic_partitions`
    statement for it, over a chunk of keys at a time (a storage that is not Dagster's SQL event log:
    Dagster's `has_dynamic_partition`, key by key)."""
    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        return {key for key in keys if instance.has_dynamic_partition(partitions_def_name, key)}
    found: set[str] = set()
    with storage.index_connection() as conn:
        for start in range(0, len(keys), DELETE_CHUNK):
            found.update(row[0] for row in conn.execute(select(DynamicPartitionsTable.c.partition).where(and_(
                DynamicPartitionsTable.c.partitions_def_name == partitions_def_name,
                DynamicPartitionsTable.c.partition.in_(list(keys[start:start + DELETE_CHUNK])),
            ))))
    return found


# -- 4. partition status warmed in the background -----------------------------------------------


def warm_partition_status(instance: DagsterInstance, asset_keys: Sequence[AssetKey],
                          partitions_def: PartitionsDefinition, definition_id: str) -> list[AssetKey]:
    """Bring each asset's partition status cache up to the partition keys whose identifier is
    `definition_id` (`partitions_def.get_serializable_unique_identifier()`, read by the caller once
    for all), where its stored cache was made for other keys; return the assets rebuilt. Dagster's
    own function does the work and stores the result, as when the UI asks; an asset whose cache is
    current is not touched (the UI's next read then only adds the events since)."""
    records = {record.asset_entry.asset_key: record for record in instance.get_asset_records(list(asset_keys))}
    rebuilt = []
    for key in asset_keys:
        record = records.get(key)
        cached = record.asset_entry.cached_status if record is not None else None
        if record is None or (cached is not None and cached.partitions_def_id == definition_id):
            continue  # nothing materialized yet (nothing to show), or current
        get_and_update_asset_status_cache_value(instance, key, partitions_def)
        rebuilt.append(key)
    return rebuilt


# -- 6. partition status carried over to added keys ----------------------------------------------


def carry_partition_status(instance: DagsterInstance, partitions_def_name: str, added: set[str]) -> list[AssetKey]:
    """Move each asset's partition status cache that was made for the dynamic partitions' keys
    before `added` joined them (its identifier: Dagster's hash of that ordered key list) over to the
    keys now, where none of the added keys has a materialization or a planned one of the asset: its
    materialized, failed and in-progress partitions are then exactly what they were, and a rebuild
    would read the whole event log to find so. Return the assets moved over.

    The key list before is the list now without `added` (keys are listed in the order they were
    added, and an added key was not there before). Where that guess is wrong (a key removed since,
    keys added by another process meanwhile), no cache carries its identifier and nothing is
    written: Dagster rebuilds the status when the UI next reads it, as it always did."""
    after = list(instance.get_dynamic_partitions(partitions_def_name))
    present = added.intersection(after)
    if not present:
        return []
    before_id = generate_partition_key_based_definition_id([key for key in after if key not in present])
    after_id = generate_partition_key_based_definition_id(after)
    storage = instance.event_log_storage
    carried = []
    for record in instance.get_asset_records():
        cached = record.asset_entry.cached_status
        if cached is None or cached.partitions_def_id != before_id:
            continue
        key = record.asset_entry.asset_key
        if any(storage.get_latest_storage_id_by_partition(key, event_type, partitions=present)
               for event_type in (DagsterEventType.ASSET_MATERIALIZATION,
                                  DagsterEventType.ASSET_MATERIALIZATION_PLANNED)):
            continue  # a key with history (a lead brought back): Dagster rebuilds the status
        instance.update_asset_cached_status_data(key, cached._replace(partitions_def_id=after_id))
        carried.append(key)
    return carried


# -- 5. a run executed in the process at hand ----------------------------------------------------


def execute_run_here(run_id: str, instance: DagsterInstance) -> int:
    """Execute the run `run_id` in this process, as `dagster api execute_run` does: the worker's
    "Started process for run (pid: N)" engine event, the run's events, its end (a failure reported
    before this returns), interrupts (SIGINT, SIGTERM) turned into the run's cancellation. The
    events go to the instance only: nobody reads the command's stream here. Returns 0, as Dagster's
    command does when it is not asked for an exit code on failure."""
    with capture_interrupts():
        return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)
