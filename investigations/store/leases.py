"""The identity pool's SQL hot path: leasing, heartbeats and releases as few round trips as can be.

A lease is the fleet's most frequent write (every collection takes and gives back one), so its
statements are compiled once and run on plain DB-API connections: on SQLite in group-committed
`BEGIN IMMEDIATE` transactions under one lock per file, on Postgres on the pool's own connections
with the statements prepared once. The pool (`investigations.identities.pool`) decides what to
lease; this module only runs the statements.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import MetaData, String, Table, and_, bindparam, case, func, or_, select, update
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2

from investigations.store import schema as s
from investigations.store.state import StateStore

# One lock per SQLite file: threads of one process queue here instead of in SQLite's busy handler,
# which sleeps in 1-100 ms steps. (A first-come first-served hand-off was tried: every hand-off
# then waits for the GIL, which cut throughput by a fifth without improving the p99.)
_SQLITE_LOCKS: dict[str, threading.Lock] = {}
_SQLITE_LOCKS_GUARD = threading.Lock()


# The tables the lease statements touch, by the short names the statements use.
TABLES = {"L": s.identity_leases, "I": s.identities, "H": s.identity_health, "R": s.range_rests,
          "T": s.tier_state, "RL": s.rate_lanes}


def tables_in_schema(schema: str | None) -> dict[str, Table]:
    """The tables the lease statements use, placed in `schema` the way the engine's
    schema_translate_map would place them (statements compiled once can't be translated per call)."""
    if schema is None:
        return TABLES
    translated = MetaData()
    return {key: table.to_metadata(translated, schema=schema) for key, table in TABLES.items()}


def acquire_statement(t: Mapping[str, Table], *, lanes: bool, pg: bool) -> Any:
    """UPDATE the first candidate slot, RETURNING it: the whole choice in one statement.

    Candidates: the source's free slots (released or expired) of active identities of the tier the
    source is served from (stored tier, never below the floor), not resting or retired there, whose
    range is not resting there and, with `lanes`, whose identity lane can send now. The slots are
    walked least recently leased first on the LRU index, and every test is a correlated lookup by
    key, so the walk stops at the first slot that fits instead of judging them all.
    """
    L, I, H, R, T = t["L"], t["I"], t["H"], t["R"], t["T"]  # noqa: E741 - the tables' one-letter aliases
    cand = L.alias("cand")
    source: Any = bindparam("p_source")
    now: Any = bindparam("p_now")
    floor: Any = bindparam("p_floor")
    stored = func.coalesce(select(T.c.tier_index).where(T.c.source == source).scalar_subquery(), 0)
    tier = case((stored < floor, floor), else_=stored)
    of_tier = select(I.c.identity_id).where(I.c.identity_id == cand.c.identity_id, I.c.active, I.c.tier_rank == tier)
    unavailable = select(H.c.identity_id).where(
        H.c.identity_id == cand.c.identity_id, H.c.source == cand.c.source,
        or_(H.c.state == "retired", and_(H.c.state == "resting", H.c.rest_until_s > now)),
    )
    range_resting = (
        select(R.c.range)
        .join(I, I.c.range == R.c.range)
        .where(I.c.identity_id == cand.c.identity_id, R.c.source == cand.c.source, R.c.rest_until_s > now)
    )
    conditions = [
        cand.c.source == source,
        or_(cand.c.released, cand.c.expires_at_s <= now),
        of_tier.exists(),
        ~unavailable.exists(),
        ~range_resting.exists(),
    ]
    if lanes:
        RL = t["RL"]
        limit: Any = bindparam("p_lane_limit")
        lane_busy = select(RL.c.lane).where(
            RL.c.lane == bindparam("p_lane_prefix", type_=String) + cand.c.identity_id,
            or_(RL.c.tat_s > limit, RL.c.not_before_s > limit),
        )
        conditions.append(~lane_busy.exists())
    pick = (
        select(cand.c.identity_id)
        .where(*conditions)
        .order_by(cand.c.acquired_at_s, cand.c.identity_id)
        .limit(1)
    )
    if pg:
        # Lock only the slot rows: a slot another acquirer holds is skipped, not waited for.
        pick = pick.with_for_update(skip_locked=True, of=cand)
    return (
        update(L)
        .where(L.c.source == source, L.c.identity_id == pick.scalar_subquery(),
               or_(L.c.released, L.c.expires_at_s <= now))
        .values(lease_id=bindparam("p_lease_id"), holder=bindparam("p_holder"), fencing_token=L.c.fencing_token + 1,
                acquired_at_s=now, expires_at_s=bindparam("p_expires"), released=False)
        .returning(L.c.identity_id, L.c.fencing_token)
    )


def lease_statements(t: Mapping[str, Table], *, pg: bool) -> dict[str, Any]:
    L = t["L"]
    current = and_(L.c.source == bindparam("p_source"), L.c.identity_id == bindparam("p_identity"),
                   L.c.fencing_token == bindparam("p_token"), L.c.lease_id == bindparam("p_lease_id"),
                   L.c.released.is_(False))
    return {
        "acquire": acquire_statement(t, lanes=False, pg=pg),
        "acquire_lanes": acquire_statement(t, lanes=True, pg=pg),
        "heartbeat": update(L).where(current, L.c.expires_at_s > bindparam("p_now"))
        .values(expires_at_s=bindparam("p_expires")).returning(L.c.fencing_token),
        "release": update(L).where(current).values(released=True).returning(L.c.fencing_token),
    }


@dataclass(eq=False)
class _Pending:
    """One lease statement waiting for its batch (SQLite group commit)."""

    sql: str
    args: tuple[Any, ...]
    woken: threading.Event = field(default_factory=threading.Event)
    leads: bool = False
    finished: bool = False
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    error: BaseException | None = None


class LeaseHotPath:
    """Runs the lease statements, each compiled once, on plain DB-API connections, one round trip each.

    SQLite: one connection per pool, used under the per-file lock, in `BEGIN IMMEDIATE`
    transactions that group the lease statements of every thread waiting at that moment (group
    commit): SQLite runs one writer at a time anyway, and the commit is half the cost of a lease.

    Postgres: up to `connections` autocommit connections of the pool's own, each with the statements
    PREPAREd once and planned generically: the acquire statement takes longer to plan than to run.
    """

    def __init__(self, store: StateStore, statements: Mapping[str, Any], *, write_lock: Any, connections: int) -> None:
        self._engine = store.engine
        self._pg = store.dialect == "postgresql"
        self._write_lock = write_lock
        # name -> (SQL, parameter names in positional order, values of the statement's own constants)
        self._sql: dict[str, tuple[str, list[str], dict[str, Any]]] = {}
        dialect = PGDialect_psycopg2(paramstyle="numeric_dollar") if self._pg else store.engine.dialect
        for name, stmt in statements.items():
            compiled = stmt.compile(dialect=dialect)
            self._sql[name] = (compiled.string, list(compiled.positiontup or []), dict(compiled.params))
        self._sqlite_conn: Any = None
        self._queue: list[_Pending] = []
        self._queue_guard = threading.Lock()
        self._leading = False
        self._pg_idle: list[Any] = []
        self._pg_slots = threading.BoundedSemaphore(connections)
        self._pg_guard = threading.Lock()

    def run(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Execute one statement as its own transaction and return its rows."""
        _, order, constants = self._sql[name]
        args = tuple(params[key] if key in params else constants[key] for key in order)
        if self._pg:
            return self._run_pg(name, args)
        return self._run_sqlite(name, args)

    def _run_sqlite(self, name: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        # Group commit: the first caller to find no batch under way leads one; whoever arrives while
        # it runs queues for the next, which the leader hands to the first of them. One commit for
        # many leases halves the cost of each when threads lease at once, and changes nothing for one.
        item = _Pending(self._sql[name][0], args)
        with self._queue_guard:
            self._queue.append(item)
            if not self._leading:
                self._leading = item.leads = True
        if not item.leads:
            item.woken.wait()  # with its answer, or to lead the next batch
        if not item.finished:
            try:
                with self._write_lock:
                    with self._queue_guard:
                        batch, self._queue = self._queue, []
                    self._commit(batch)
            finally:
                with self._queue_guard:
                    if self._queue:
                        self._queue[0].leads = True
                        self._queue[0].woken.set()
                    else:
                        self._leading = False
        if item.error is not None:
            raise item.error
        return item.rows

    def _commit(self, batch: list[_Pending]) -> None:
        """Run a batch in one immediate transaction and wake its callers, each with its rows or error.

        If a statement fails, the batch is rolled back and its statements run again one by one, so a
        failure reaches only its own caller. If the transaction can't even start (the database stays
        locked past the busy timeout), every caller gets that error at once.
        """
        try:
            if self._sqlite_conn is None:
                # Through the engine's pool, so its connect hook (WAL, busy timeout, no implicit
                # transactions) applies; kept for the pool's life, used only under the lock.
                self._sqlite_conn = self._engine.raw_connection()
            cursor = self._sqlite_conn.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    for item in batch:
                        cursor.execute(item.sql, item.args)
                        item.rows = [tuple(row) for row in cursor.fetchall()]
                    cursor.execute("COMMIT")
                except Exception:  # noqa: BLE001 - whatever failed, each caller gets its own statement's fate
                    cursor.execute("ROLLBACK")
                    for item in batch:
                        item.rows = []
                        try:
                            cursor.execute(item.sql, item.args)  # autocommit: its own transaction
                            item.rows = [tuple(row) for row in cursor.fetchall()]
                        except Exception as exc:  # noqa: BLE001 - handed to the caller, raised in its thread
                            item.error = exc
            finally:
                cursor.close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in every caller's thread, the leader's included
            for item in batch:
                if item.error is None:
                    item.error = exc
        finally:
            for item in batch:
                item.finished = True
                item.woken.set()

    def _run_pg(self, name: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        call = f"EXECUTE lease_{name}({', '.join(['%s'] * len(args))})" if args else f"EXECUTE lease_{name}"
        with self._pg_slots:
            for attempt in (1, 2):
                with self._pg_guard:
                    conn = self._pg_idle.pop() if self._pg_idle else None
                fresh = conn is None
                if conn is None:
                    conn = self._open_pg()
                try:
                    with conn.cursor() as cursor:
                        cursor.execute(call, args)
                        rows = [tuple(row) for row in cursor.fetchall()]
                except self._engine.dialect.loaded_dbapi.Error:
                    if not conn.closed:  # the statement failed; the connection is fine
                        with self._pg_guard:
                            self._pg_idle.append(conn)
                        raise
                    if fresh or attempt == 2:
                        raise
                    # An idle connection died: the server restarted, so the other idle ones died
                    # with it. Drop them all and try once more on a new connection.
                    with self._pg_guard:
                        stale, self._pg_idle = self._pg_idle, []
                    for dead in stale:
                        dead.close()
                    continue
                with self._pg_guard:
                    self._pg_idle.append(conn)
                return rows
        raise AssertionError("unreachable")

    def _open_pg(self) -> Any:
        cargs, cparams = self._engine.dialect.create_connect_args(self._engine.url)
        conn: Any = self._engine.dialect.connect(*cargs, **cparams)
        conn.autocommit = True  # each lease statement is its own transaction
        with conn.cursor() as cursor:
            # On this connection only: see the module docstring for why lease commits may skip the
            # WAL flush. The statements' plans don't depend on their parameters, so plan them once.
            cursor.execute("SET synchronous_commit TO off")
            cursor.execute("SET plan_cache_mode TO force_generic_plan")
            for name, (sql, _, _) in self._sql.items():
                cursor.execute(f"PREPARE lease_{name} AS {sql}")
        return conn

    def close(self) -> None:
        with self._write_lock:
            if self._sqlite_conn is not None:
                self._sqlite_conn.close()
                self._sqlite_conn = None
        with self._pg_guard:
            idle, self._pg_idle = self._pg_idle, []
        for conn in idle:
            conn.close()


def sqlite_write_lock(store: StateStore) -> threading.Lock:
    key = str(store.engine.url)
    with _SQLITE_LOCKS_GUARD:
        return _SQLITE_LOCKS.setdefault(key, threading.Lock())

