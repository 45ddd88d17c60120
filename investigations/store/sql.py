"""What the state store's table families share: the engine they run on, the clock, and the
dialect-aware insert and upsert every family's writes use (SQLite and Postgres alike)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.dialects import postgresql, sqlite

from investigations.store.engine import READ_ONLY


def utcnow() -> datetime:
    return datetime.now(UTC)


class Tables:
    """The base of every table family: the engine the facade (`StateStore`) opened."""

    engine: Engine

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A transaction that only reads: on SQLite it takes no write lock, so it waits for no writer."""
        with self.engine.connect() as conn:
            conn.execution_options(**{READ_ONLY: True})
            with conn.begin():
                yield conn


def dialect_insert(conn: Connection, table: Table) -> Any:
    """An INSERT on `table` with the dialect's ON CONFLICT clauses (Postgres' or SQLite's)."""
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(table)


def insert_new(conn: Connection, table: Table, rows: list[dict[str, Any]], *, keys: list[str]) -> list[Any]:
    """Insert rows whose key is new; return the primary keys of the rows actually inserted."""
    stmt = dialect_insert(conn, table).on_conflict_do_nothing(index_elements=keys).returning(*table.primary_key.columns)
    return [row[0] for row in conn.execute(stmt, rows)]


def upsert(conn: Connection, table: Table, rows: list[dict[str, Any]], *, keys: list[str], update: list[str]) -> None:
    """Insert rows; on a key conflict update `update` columns, or leave the row alone when empty."""
    if not rows:
        return
    stmt = dialect_insert(conn, table)
    if update:
        stmt = stmt.on_conflict_do_update(index_elements=keys, set_={c: stmt.excluded[c] for c in update})
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=keys)
    conn.execute(stmt, rows)
