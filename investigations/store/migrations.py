"""Bring a state store database to the current schema version, safely from several processes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    inspect,
    select,
    text,
)

from investigations.store import schema as s

# Each step takes a database at version N-1 to N (and is given the Postgres schema, if any). A step
# may create a table from its declaration in `schema.py` only while that declaration is unchanged
# since the step was written; a later change to a table is a new step with explicit DDL (ALTER
# TABLE ...), and the step that created the table then creates it from a frozen copy of the columns
# it had then, so every database, new or old, goes through the same DDL.

# `rate_lanes` as version 2 created it; version 4 adds its ceiling columns, version 5 its recent sends.
_RATE_LANES_V2 = Table(
    "rate_lanes",
    MetaData(),
    Column("lane", String(200), primary_key=True),
    Column("tat_s", Float, nullable=False),
    Column("not_before_s", Float, nullable=False),
    Column("rate_factor", Float, nullable=False),
    Column("updated_at_s", Float, nullable=False),
)


def _qualified(conn: Connection, table: str, schema: str | None) -> str:
    # Raw DDL bypasses the engine's schema translation: name the schema here.
    quote = conn.dialect.identifier_preparer
    return f"{quote.quote_schema(schema)}.{quote.quote(table)}" if schema else quote.quote(table)


# `collection_queue` as version 2 created it; version 6 adds `handover_key`, `run_deaths` and `park_reason`.
_COLLECTION_QUEUE_V2 = Table(
    "collection_queue",
    MetaData(),
    Column("id", s.BigId, primary_key=True, autoincrement=True),
    Column("source", String(64), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("origin", String(200), nullable=False),
    Column("priority_class", String(16), nullable=False),
    Column("case_id", String(200), nullable=True),
    Column("state", String(16), nullable=False),
    Column("not_before", s.UTCDateTime, nullable=False),
    Column("enqueued_at", s.UTCDateTime, nullable=False),
    Column("dispatched_at", s.UTCDateTime, nullable=True),
    Column("finished_at", s.UTCDateTime, nullable=True),
    Column("outcome", String(16), nullable=True),
    UniqueConstraint("source", "lead_id", "origin", name="uq_queue_source_lead_origin"),
    Index("ix_queue_source_state", "source", "state", "not_before"),
)


# `collections` as version 1 created it (version 7 added `common_fields`).
_COLLECTIONS_V1 = Table(
    "collections",
    MetaData(),
    Column("source", String(64), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("records", Integer, nullable=False),
    Column("content_hash", String(64), nullable=True),
    Column("path", Text, nullable=True),
    Column("run_id", String(64), nullable=True),
    Column("last_attempt_at", s.UTCDateTime, nullable=False),
    Column("last_success_at", s.UTCDateTime, nullable=True),
    PrimaryKeyConstraint("source", "lead_id"),
)


# `leads` as version 1 created it (version 13 added `retired_at`, version 14 `partition_key`).
_LEADS_V1 = Table(
    "leads",
    MetaData(),
    Column("lead_id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("value", Text, nullable=False),
    Column("created_at", s.UTCDateTime, nullable=False),
)


def _create_base(conn: Connection, _schema: str | None) -> None:
    s.metadata.create_all(
        conn, tables=[s.schema_version, s.cases, s.case_leads, s.inbox, s.fetch_log, s.dead_letters]
    )
    _LEADS_V1.create(conn)
    _COLLECTIONS_V1.create(conn)


def _create_flow_control(conn: Connection, _schema: str | None) -> None:
    # New tables only: `rate_lanes` and `collection_queue` from their version-2 copies, `circuits`
    # from its unchanged declaration.
    _RATE_LANES_V2.create(conn)
    _COLLECTION_QUEUE_V2.create(conn)
    s.metadata.create_all(conn, tables=[s.circuits])


def _add_lane_ceiling(conn: Connection, schema: str | None) -> None:
    # Existing lanes start with no ceiling known and no cut on record, as a new lane does.
    lanes = _qualified(conn, "rate_lanes", schema)
    conn.execute(text(f"ALTER TABLE {lanes} ADD COLUMN ceiling_factor FLOAT NOT NULL DEFAULT 1"))
    conn.execute(text(f"ALTER TABLE {lanes} ADD COLUMN last_cut_s FLOAT NOT NULL DEFAULT 0"))


def _add_lane_recent_sends(conn: Connection, schema: str | None) -> None:
    # Existing lanes start with no sends remembered, as a new lane does: the guard starts from the next.
    lanes = _qualified(conn, "rate_lanes", schema)
    conn.execute(text(f"ALTER TABLE {lanes} ADD COLUMN recent_sends TEXT NOT NULL DEFAULT ''"))


def _add_queue_handovers(conn: Connection, schema: str | None) -> None:
    # Rows queued or dispatched before belong to no handover: a batch run of the old kind named its
    # members in a run tag, and none is left once the fleet restarts on this version.
    queue = _qualified(conn, "collection_queue", schema)
    index = conn.dialect.identifier_preparer.quote("ix_queue_handover_key")
    conn.execute(text(f"ALTER TABLE {queue} ADD COLUMN handover_key VARCHAR(200)"))
    conn.execute(text(f"ALTER TABLE {queue} ADD COLUMN run_deaths INTEGER NOT NULL DEFAULT 0"))
    conn.execute(text(f"ALTER TABLE {queue} ADD COLUMN park_reason TEXT"))
    conn.execute(text(f"CREATE INDEX {index} ON {queue} (handover_key)"))


def _add_collection_fields(conn: Connection, schema: str | None) -> None:
    # Collections stored before carry no field list: the drift check learns from the next ones.
    collections = _qualified(conn, "collections", schema)
    conn.execute(text(f"ALTER TABLE {collections} ADD COLUMN common_fields TEXT"))


def _add_collectors(conn: Connection, schema: str | None) -> None:
    # Rows dispatched before carry no start: a run of theirs that dies blames each, as before.
    queue = _qualified(conn, "collection_queue", schema)
    kind = "TIMESTAMP" if conn.dialect.name == "postgresql" else "DATETIME"
    conn.execute(text(f"ALTER TABLE {queue} ADD COLUMN started_at {kind}"))
    s.metadata.create_all(conn, tables=[s.collectors])


def _add_source_incidents(conn: Connection, _schema: str | None) -> None:
    # A new table only. Every source starts with no incident and no canary pass on record: the
    # recurring planner's next pass reads both from each canary's latest collection (an incident
    # under way then is dated from that collection, the earliest failure the store still shows).
    s.metadata.create_all(conn, tables=[s.source_incidents])


def _add_lead_visits(conn: Connection, schema: str | None) -> None:
    # A new table, seeded from what the collections already know: each lead's last answer with
    # records (when, its content hash) is what its next collection is compared with, so its first
    # visit after the upgrade already counts. No visits yet: every lead starts from its source's prior.
    s.metadata.create_all(conn, tables=[s.lead_visits])
    visits, collections = _qualified(conn, "lead_visits", schema), _qualified(conn, "collections", schema)
    conn.execute(text(
        f"INSERT INTO {visits} (source, lead_id, seen_at, seen_hash, visits) "
        f"SELECT source, lead_id, last_success_at, content_hash, '' FROM {collections} "
        "WHERE records > 0 AND content_hash IS NOT NULL AND last_success_at IS NOT NULL"))


def _index_queue_finished_at(conn: Connection, schema: str | None) -> None:
    queue = _qualified(conn, "collection_queue", schema)
    index = conn.dialect.identifier_preparer.quote("ix_queue_finished_at")
    conn.execute(text(f"CREATE INDEX {index} ON {queue} (finished_at)"))


def _add_cadence_plans(conn: Connection, _schema: str | None) -> None:
    # A new table only. Every source starts with no plan on record: until the recurring planner's
    # next pass (a minute), a lead's next visit is worked out as for a source not planned yet.
    s.metadata.create_all(conn, tables=[s.cadence_plans])


def _add_lead_retirement(conn: Connection, schema: str | None) -> None:
    # Every lead registered before is one of Dagster's partitions, as it was: the new-lead sensor's
    # next lifecycle pass retires those no open case holds, a bounded number per pass.
    quote = conn.dialect.identifier_preparer.quote
    leads, queue = _qualified(conn, "leads", schema), _qualified(conn, "collection_queue", schema)
    collections = _qualified(conn, "collections", schema)
    kind = "TIMESTAMP" if conn.dialect.name == "postgresql" else "DATETIME"
    conn.execute(text(f"ALTER TABLE {leads} ADD COLUMN retired_at {kind}"))
    conn.execute(text(f"CREATE INDEX {quote('ix_leads_retired_at')} ON {leads} (retired_at)"))
    conn.execute(text(f"CREATE INDEX {quote('ix_queue_state_lead')} ON {queue} (state, lead_id)"))
    conn.execute(text(f"CREATE INDEX {quote('ix_collections_last_attempt')} ON {collections} (last_attempt_at)"))


def _add_lead_partition_keys(conn: Connection, schema: str | None) -> None:
    # The leads registered before keep their ids as partition keys (NULL), and with them their
    # materializations and check results in Dagster, which are recorded by key; leads registered
    # from now on are keyed `kind:value`.
    conn.execute(text(f"ALTER TABLE {_qualified(conn, 'leads', schema)} ADD COLUMN partition_key TEXT"))


def _add_source_totals(conn: Connection, _schema: str | None) -> None:
    # A new table only: the running totals start at 0, from the first collection after the upgrade.
    s.metadata.create_all(conn, tables=[s.source_totals])


MIGRATIONS: dict[int, Callable[[Connection, str | None], None]] = {
    1: _create_base,
    2: _create_flow_control,
    3: lambda conn, _schema: s.metadata.create_all(
        conn, tables=[s.identities, s.identity_leases, s.identity_health, s.range_rests, s.tier_state,
                      s.identity_cookies]
    ),
    4: _add_lane_ceiling,
    5: _add_lane_recent_sends,
    6: _add_queue_handovers,
    7: _add_collection_fields,
    8: _add_collectors,
    9: _add_source_incidents,
    10: _add_lead_visits,
    11: _index_queue_finished_at,
    12: _add_cadence_plans,
    13: _add_lead_retirement,
    14: _add_lead_partition_keys,
    15: _add_source_totals,
}

_LOCK_KEY = 0x1A5E5  # arbitrary constant shared by every process migrating the same database


def migrate(engine: Engine, *, schema: str | None = None, version: int | None = None) -> int:
    """Apply every missing step up to `version` (default: this code's) in one transaction.

    Returns the version the database is at afterwards.
    """
    target = s.SCHEMA_VERSION if version is None else version
    if not 1 <= target <= s.SCHEMA_VERSION:
        raise ValueError(f"no schema version {target}: this code knows versions 1 to {s.SCHEMA_VERSION}")
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
        for step in range(current + 1, target + 1):
            MIGRATIONS[step](conn, schema)
            conn.execute(s.schema_version.insert().values(version=step, applied_at=datetime.now(UTC)))
        return max(current, target)


def _current_version(conn: Connection, schema: str | None) -> int:
    if not inspect(conn).has_table("schema_version", schema=schema):
        return 0
    found = conn.execute(select(s.schema_version.c.version).order_by(s.schema_version.c.version.desc())).first()
    return found[0] if found else 0
