"""Engines for the state store: SQLite tuned for many processes, or Postgres.

SQLite gets WAL, a long busy timeout and `BEGIN IMMEDIATE` for every transaction, so concurrent
writers from several run processes queue for the lock instead of failing with `database is locked`
halfway through a read-then-write. A transaction opened with the `READ_ONLY` execution option (see
`Tables.reading`) begins deferred instead: under WAL a reader neither waits for the writer nor
holds it up, which matters for what is polled several times a second (the new-lead sensors' inbox
look-up) while run workers write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

SQLITE_BUSY_TIMEOUT_MS = 30_000
READ_ONLY = "investigations_read_only"  # execution option: this transaction only reads


def make_engine(url: str, *, schema: str | None = None) -> Engine:
    """An engine for `url`; `schema` (Postgres only) puts every table in that schema."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if schema:
            raise ValueError("schema= applies to Postgres only")
        return _sqlite_engine(url)
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            # SQLAlchemy 2.1 maps bare postgresql:// to psycopg 3; the pinned driver is psycopg2.
            parsed = parsed.set(drivername="postgresql+psycopg2")
        engine = create_engine(parsed, pool_pre_ping=True, pool_size=5, max_overflow=5)
        if schema:
            engine = engine.execution_options(schema_translate_map={None: schema})
        return engine
    raise ValueError(f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:/// or postgresql://")


def _sqlite_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy's "begin" hook below instead of pysqlite's own.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

    return engine
