"""Tables of the state store, on SQLAlchemy Core so one schema serves SQLite and Postgres.

The schema is versioned by the project (table `schema_version`); `migrations.py` brings a database
from any earlier version to `SCHEMA_VERSION`. Timestamps are stored as UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

SCHEMA_VERSION = 15

# SQLite only auto-increments INTEGER PRIMARY KEY; Postgres gets a 64-bit identity.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, whatever the backend keeps."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the state store; pass an aware UTC datetime")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", UTCDateTime, nullable=False),
)

cases = Table(
    "cases",
    metadata,
    Column("case_id", String(200), primary_key=True),
    Column("status", String(16), nullable=False),  # active | closed
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

leads = Table(
    "leads",
    metadata,
    Column("lead_id", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("value", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # Version 13: when the lead left Dagster's `leads` partitions (NULL: it is one). A lead retires
    # once no open case holds it and nothing is owed to it; its history stays here and in the
    # record store, and it comes back when a case takes it up again (sensors/lead_partitions.py).
    Column("retired_at", UTCDateTime, nullable=True),
    # Version 14: the lead's Dagster partition key, `kind:value` as investigators type it (see
    # `investigations.intake.leads.partition_key_for`). NULL: the key is the lead id, as it was for
    # every lead registered before version 14, whose history in Dagster is under that key.
    Column("partition_key", Text, nullable=True),
    Index("ix_leads_retired_at", "retired_at"),
)

case_leads = Table(
    "case_leads",
    metadata,
    Column("case_id", String(200), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("added_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("case_id", "lead_id"),
    Index("ix_case_leads_lead", "lead_id"),
)

# One row per (webhook, lead): the intake's idempotency key and the new-lead sensor's feed. Rows are
# ordered by id, and ids are handed out in commit order (see StateStore.accept_leads).
inbox = Table(
    "inbox",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("webhook_id", String(200), nullable=False),
    Column("case_id", String(200), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("sources", Text, nullable=True),  # JSON list, NULL = every source that takes the lead's kind
    Column("priority_class", String(16), nullable=False),
    Column("received_at", UTCDateTime, nullable=False),
    UniqueConstraint("webhook_id", "lead_id", name="uq_inbox_webhook_lead"),
)

fetch_log = Table(
    "fetch_log",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("source", String(64), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("identity_id", String(64), nullable=False),
    Column("run_id", String(64), nullable=True),
    Column("method", String(8), nullable=False),
    Column("url", Text, nullable=False),
    Column("status", Integer, nullable=True),
    Column("outcome", String(16), nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("error", Text, nullable=True),
    Column("at", UTCDateTime, nullable=False),
    Index("ix_fetch_log_source_at", "source", "at"),
    Index("ix_fetch_log_lead", "lead_id"),
)

# Latest state of each collection (source, lead): what the last attempt stored and when it last worked.
collections = Table(
    "collections",
    metadata,
    Column("source", String(64), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("outcome", String(16), nullable=False),  # ok | empty | failed
    Column("records", Integer, nullable=False),
    Column("content_hash", String(64), nullable=True),
    Column("path", Text, nullable=True),
    Column("run_id", String(64), nullable=True),
    Column("last_attempt_at", UTCDateTime, nullable=False),
    Column("last_success_at", UTCDateTime, nullable=True),
    # version 7: the fields every record of the latest successful collection carried (JSON list,
    # sorted); what the schema-drift check compares a new answer with. NULL: not known (older rows).
    Column("common_fields", Text, nullable=True),
    PrimaryKeyConstraint("source", "lead_id"),
    # Version 13: the leads collected lately, which keep their partitions a while (see `leads.retired_at`).
    Index("ix_collections_last_attempt", "last_attempt_at"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("source", String(64), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("reason_group", String(32), nullable=False),
    Column("last_status", Integer, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("last_error", Text, nullable=True),
    Column("first_seen", UTCDateTime, nullable=False),
    Column("last_seen", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("source", "lead_id"),
    Index("ix_dead_letters_reason", "reason_group"),
)


# --- version 2: flow control ------------------------------------------------------------------

# One row per rate lane ("source:<name>" or "identity:<source>:<identity>"): a GCRA state shared by
# every process. Times are wall-clock epoch seconds because several processes read them.
rate_lanes = Table(
    "rate_lanes",
    metadata,
    Column("lane", String(200), primary_key=True),
    Column("tat_s", Float, nullable=False),  # theoretical arrival time of the next request
    Column("not_before_s", Float, nullable=False),  # Retry-After floor: nothing leaves before this
    Column("rate_factor", Float, nullable=False),  # AIMD multiplier of the configured rate, (0, 1]
    Column("updated_at_s", Float, nullable=False),
    # version 4: the remembered ceiling (see investigations.pacing.aimd)
    Column("ceiling_factor", Float, nullable=False, server_default="1"),  # factor last throttled at; 1 = none
    Column("last_cut_s", Float, nullable=False, server_default="0"),  # when it was last cut; 0 = never
    # version 5: the rhythm guard's memory (see investigations.pacing.jitter): planned send times of
    # a guarded lane's last requests, epoch seconds (Python float repr), comma separated, oldest
    # first; '' = none yet
    Column("recent_sends", Text, nullable=False, server_default=""),
)

circuits = Table(
    "circuits",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("state", String(16), nullable=False),  # closed | open | half_open
    Column("failure_streak", Integer, nullable=False),
    Column("opened_at_s", Float, nullable=True),
    Column("probe_at_s", Float, nullable=True),  # when an open circuit may send its one probe
    Column("opens", Integer, nullable=False),  # how many times it opened in a row (cooldown grows)
    Column("updated_at_s", Float, nullable=False),
)

# The fleet's own backlog: one row per collection wanted. Dagster is fed from here a bounded amount
# per source, so a source that is down or throttled holds its work here, not in the run queue.
collection_queue = Table(
    "collection_queue",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("source", String(64), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("origin", String(200), nullable=False),  # inbox:<id> | requeue:<n> | recurring:<window> ...
    Column("priority_class", String(16), nullable=False),
    Column("case_id", String(200), nullable=True),
    Column("state", String(16), nullable=False),  # queued | dispatched | done
    Column("not_before", UTCDateTime, nullable=False),
    Column("enqueued_at", UTCDateTime, nullable=False),
    Column("dispatched_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("outcome", String(16), nullable=True),
    # Version 6: the run a dispatched row went out in (the dispatcher's handover key, also the run's
    # `investigations/handover` tag). A batch run reads its members here rather than from a run tag,
    # which would hold thousands of lead ids; a run that died gives its rows back by this key.
    Column("handover_key", String(200), nullable=True),
    # How many runs this row went out in died without collecting it (worker killed, run stuck).
    Column("run_deaths", Integer, nullable=False, server_default="0"),
    # Why a parked collection waits (the limiter refused, a full lane, no identity).
    Column("park_reason", Text, nullable=True),
    # Version 8: when the run it went out in began collecting it (None: not yet). A run that dies
    # blames only the rows it had begun: one of those is what may have killed it.
    Column("started_at", UTCDateTime, nullable=True),
    UniqueConstraint("source", "lead_id", "origin", name="uq_queue_source_lead_origin"),
    Index("ix_queue_source_state", "source", "state", "not_before"),
    Index("ix_queue_handover_key", "handover_key"),
    # Version 11: the window's finished rows (the fleet figures' recurring share), read every minute
    # and at every scrape: without it, a scan of every row the queue ever held.
    Index("ix_queue_finished_at", "finished_at"),
    # Version 13: the leads something is still owed to (state queued or dispatched), which keep their
    # partitions, read without a scan of every row the queue ever held.
    Index("ix_queue_state_lead", "state", "lead_id"),
)


# --- version 3: the identity pool ---------------------------------------------------------------
# Times are wall-clock epoch seconds (`*_s`), like the rate lanes: several processes compare them.

# The registry of identities, synced from the identities file. Never holds credentials: the proxy is
# kept redacted, for display. An identity dropped from the file stays, inactive, so its history does.
identities = Table(
    "identities",
    metadata,
    Column("identity_id", String(64), primary_key=True),
    Column("range", String(64), nullable=False),
    Column("tier", String(32), nullable=False),
    Column("tier_rank", Integer, nullable=False),  # position in the file's `tiers:` list, cheapest 0
    Column("cost_per_request_usd", Float, nullable=False),
    Column("cost_per_mb_usd", Float, nullable=False),
    Column("proxy", Text, nullable=True),  # redacted proxy URL; NULL = direct
    Column("active", Boolean, nullable=False),
    Column("synced_at_s", Float, nullable=False),
)

# One lease slot per (source, identity), reused lease after lease: the key makes "one lease per
# (identity, source) at a time" structural. The fencing token grows with every acquire, so a holder
# whose lease ran out (and was taken over) can no longer write health back.
# Version 8: interactive runs open to fresh leads of their source (see `investigations.collection.runwork` and
# `investigations.scheduling.dispatch.join_collectors`). A run keeps its row while it takes work, renewing `open_until_s`; the dispatcher
# joins a fresh lead to it only while that is ahead, and in the same transaction as the row, so a
# run that closed (deleted its row) or died (let it lapse) is never handed a lead.
collectors = Table(
    "collectors",
    metadata,
    Column("handover_key", String(200), primary_key=True),
    Column("source", String(64), nullable=False),
    Column("open_until_s", Float, nullable=False),
    Index("ix_collectors_source", "source"),
)

identity_leases = Table(
    "identity_leases",
    metadata,
    Column("source", String(64), nullable=False),
    Column("identity_id", String(64), nullable=False),
    Column("lease_id", String(32), nullable=True),  # of the current or last lease
    Column("holder", String(200), nullable=True),
    Column("fencing_token", BigInteger, nullable=False),
    Column("acquired_at_s", Float, nullable=False),  # also the LRU order of the slot
    Column("expires_at_s", Float, nullable=False),
    Column("released", Boolean, nullable=False),
    PrimaryKeyConstraint("source", "identity_id"),
    # acquire walks a source's slots least recently leased first and stops at the first that fits.
    Index("ix_identity_leases_lru", "source", "acquired_at_s", "identity_id"),
)

# Health of one identity at one source (investigations.identities.health is the state machine).
identity_health = Table(
    "identity_health",
    metadata,
    Column("identity_id", String(64), nullable=False),
    Column("source", String(64), nullable=False),
    Column("score", Float, nullable=False),
    Column("state", String(16), nullable=False),  # healthy | resting | retired
    Column("rests", Integer, nullable=False),
    Column("rest_until_s", Float, nullable=True),
    Column("flagged_at_s", Float, nullable=True),  # last time it was sent to rest (or retired)
    Column("successes_in_row", Integer, nullable=False),
    Column("updated_at_s", Float, nullable=False),
    PrimaryKeyConstraint("identity_id", "source"),
    Index("ix_identity_health_source_flagged", "source", "flagged_at_s"),
)

# A whole range (provider, subnet) resting at one source after several of its identities were flagged.
range_rests = Table(
    "range_rests",
    metadata,
    Column("range", String(64), nullable=False),
    Column("source", String(64), nullable=False),
    Column("rest_until_s", Float, nullable=False),
    Column("rests", Integer, nullable=False),
    Column("updated_at_s", Float, nullable=False),
    PrimaryKeyConstraint("range", "source"),
)

# The tier a source is served from: escalated when the cheaper tier is blocked there, stepped back
# down after a run of successes.
tier_state = Table(
    "tier_state",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("tier_index", Integer, nullable=False),
    Column("successes_in_row", Integer, nullable=False),
    Column("updated_at_s", Float, nullable=False),
)

# Each identity's cookie jar, kept across runs so a site keeps seeing the same visitor.
identity_cookies = Table(
    "identity_cookies",
    metadata,
    Column("identity_id", String(64), primary_key=True),
    Column("cookies", Text, nullable=False),  # JSON list of {name, value, domain, path, expires, secure}
    Column("updated_at_s", Float, nullable=False),
)


# --- version 9: canary incidents ----------------------------------------------------------------

# Each source's canary incident, one row per source (`investigations.fleet.degradation.follow_canaries`
# keeps it): the latest canary collection seen passing, and the current or last incident, from its first
# failing canary collection to the one that passed again, until the recovery rule has queued the empty
# and failed leads of its window again (`investigations.scheduling.dispatch.requeue_recovered`). An
# incident that begins before the last one's leads were queued again takes over its window.
source_incidents = Table(
    "source_incidents",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("passed_at", UTCDateTime, nullable=True),  # the latest canary collection seen passing
    Column("started_at", UTCDateTime, nullable=True),  # the first failing canary collection; NULL: none yet
    Column("since", UTCDateTime, nullable=True),  # where its window begins: the last pass before it; NULL: none known
    Column("ended_at", UTCDateTime, nullable=True),  # the canary collection that passed again; NULL: open
    Column("requeued_at", UTCDateTime, nullable=True),  # when its leads were queued again; NULL: not yet
)


# --- version 10: how often each lead's answer changes ----------------------------------------------

# Per (source, lead), what `investigations.scheduling.cadence` estimates its rate of change from: its
# last answer with records (when, its content hash) and its last visits compared with the answer
# before, and the rate estimated from them for the source's prior. Written with the collection, in
# `complete_collection`'s transaction; only a collection that found records is a visit (empty and
# failed ones say nothing about change).
lead_visits = Table(
    "lead_visits",
    metadata,
    Column("source", String(64), nullable=False),
    Column("lead_id", String(64), nullable=False),
    Column("seen_at", UTCDateTime, nullable=False),  # its last answer with records
    Column("seen_hash", String(64), nullable=False),  # that answer's content hash
    # The last visits, oldest first, comma separated: `<seconds since the answer before>:<1 changed | 0 not>`.
    Column("visits", Text, nullable=False),
    # Changes per second estimated from `visits` for the source's prior of `prior_s` seconds (NULL: not
    # yet); the planner estimates again, and keeps, a rate whose prior is not its source's now.
    Column("rate_per_s", Float, nullable=True),
    Column("prior_s", Float, nullable=True),
    PrimaryKeyConstraint("source", "lead_id"),
)


# --- version 12: each source's last recurring plan -----------------------------------------------

# Per source, what its last learned recurring plan decided for every lead at once
# (`investigations.scheduling.cadence.SourcePlan`): with a lead's own rate and weight it gives that
# lead's interval, so a lead's next visit is worked out as it is stored, without planning every lead
# again. Written by the recurring planner each pass of a source it plans (one row a source).
cadence_plans = Table(
    "cadence_plans",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("scale", Float, nullable=True),  # the cadence scale c; NULL: infinite (every lead at its max)
    Column("short", Boolean, nullable=False),  # the budget could not keep every lead within max
    Column("planned_at", UTCDateTime, nullable=False),
)

# Version 15: what each source's collections found, as a running total that only grows: every
# finished collection adds the records it found (a lead collected again counts them again). The
# `collections` table keeps each lead's latest collection only, so its sum can go down; this is
# what `/metrics` serves as the counter `investigations_records_total`.
source_totals = Table(
    "source_totals",
    metadata,
    Column("source", String(64), primary_key=True),
    Column("records", BigInteger, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)
