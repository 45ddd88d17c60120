"""Bring a state store database to the current schema version, safely from several processes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, inspect, select, text

from investigations.store import schema as s

# Each step takes a database at version N-1 to N. A step may create a table from its declaration in
# `schema.py` only while that declaration is unchanged since the step was written; a later change to
# a table is a new step with explicit DDL (ALTER TABLE ...).
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: lambda conn: s.metadata.create_all(
        conn, tables=[s.schema_version, s.cases, s.leads, s.case_leads, s.inbox, s.fetch_log, s.collections,
                      s.dead_letters]
    ),
    # New tables only: creating them from their declaration is exact as long as they stay unchanged.
    2: lambda conn: s.metadata.create_all(conn, tables=[s.rate_lanes, s.circuits, s.collection_queue]),
    3: lambda conn: s.metadata.create_all(
        conn, tables=[s.identities, s.identity_leases, s.identity_health, s.range_rests, s.tier_state,
                      s.identity_cookies]
    ),
}

_LOCK_KEY = 0x1A5E5  # arbitrary constant shared by every process migrating the same database


def migrate(engine: Engine, *, schema: str | None = None) -> int:
    """Apply every missing step in one transaction and return the version reached."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Two processes starting at once must not both create the tables.
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
            if schema:
                conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        current = _current_version(conn, schema)
        if current > s.SCHEMA_VERSION:
            raise RuntimeError(
                f"the state store is at schema version {current}, newer than this code ({s.SCHEMA_VERSION})"
            )
        for version in range(current + 1, s.SCHEMA_VERSION + 1):
            MIGRATIONS[version](conn)
            conn.execute(s.schema_version.insert().values(version=version, applied_at=datetime.now(UTC)))
        return s.SCHEMA_VERSION


def _current_version(conn: Connection, schema: str | None) -> int:
    if not inspect(conn).has_table("schema_version", schema=schema):
        return 0
    found = conn.execute(select(s.schema_version.c.version).order_by(s.schema_version.c.version.desc())).first()
    return found[0] if found else 0
