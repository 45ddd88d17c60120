"""The state store: the lead inbox, cases, the fetch log, collections and dead letters.

Everything that several runs and processes must agree on lives here, in one database (SQLite by
default, Postgres for a fleet), so the engine stays stateless between calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, Table, and_, case, delete, func, select, text
from sqlalchemy.dialects import postgresql, sqlite

from investigations.events import FetchEvent
from investigations.leads import Lead
from investigations.store import schema as s
from investigations.store.engine import make_engine
from investigations.store.migrations import migrate

# What `queue_depths` counts per source (waiting: queued with a not_before still ahead).
QUEUE_DEPTH_KEYS = ("ready", "waiting", "dispatched", "ready_interactive", "dispatched_interactive")
_INBOX_LOCK_KEY = 0x1B0C5  # serializes intake commits on Postgres so inbox ids follow commit order


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class AcceptResult:
    """What one webhook delivery added: new lead ids and the ones this webhook had already delivered."""

    accepted: list[str]
    duplicates: list[str]


@dataclass(frozen=True)
class InboxItem:
    id: int
    webhook_id: str
    case_id: str
    lead: Lead
    sources: list[str] | None
    priority_class: str
    received_at: datetime


@dataclass(frozen=True)
class Collection:
    source: str
    lead_id: str
    outcome: str
    records: int
    content_hash: str | None
    path: str | None
    run_id: str | None
    last_attempt_at: datetime
    last_success_at: datetime | None
    common_fields: str | None = None


@dataclass(frozen=True)
class QueuedCollection:
    id: int
    source: str
    lead_id: str
    origin: str
    priority_class: str
    case_id: str | None
    state: str
    not_before: datetime
    enqueued_at: datetime
    dispatched_at: datetime | None
    run_deaths: int = 0


@dataclass(frozen=True)
class DeadLetter:
    source: str
    lead_id: str
    reason_group: str
    last_status: int | None
    attempts: int
    last_error: str | None
    first_seen: datetime
    last_seen: datetime


class StateStore:
    """Shared state of the fleet. Safe to use from many threads and processes at once."""

    def __init__(self, engine: Engine, *, schema: str | None = None) -> None:
        self.engine = engine
        self.schema = schema
        self.schema_version = migrate(engine, schema=schema)

    @classmethod
    def from_url(cls, url: str, *, schema: str | None = None) -> StateStore:
        return cls(make_engine(url, schema=schema), schema=schema)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    # -- leads, cases and the inbox -------------------------------------------------------------

    def accept_leads(
        self,
        *,
        webhook_id: str,
        case_id: str,
        leads: Sequence[Lead],
        sources: Sequence[str] | None,
        priority_class: str,
        now: datetime | None = None,
    ) -> AcceptResult:
        """Store one webhook delivery in a single transaction, idempotently by (webhook id, lead).

        A redelivered webhook adds nothing; the same lead in a new webhook (another case, say) is a
        new inbox row, so the case link is recorded and the lead collected for it.
        """
        now = now or utcnow()
        unique = list({lead.id: lead for lead in leads}.values())
        sources_json = json.dumps(sorted(set(sources))) if sources else None
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _INBOX_LOCK_KEY})
            _upsert(conn, s.cases, [{"case_id": case_id, "status": "active", "created_at": now, "updated_at": now}],
                    keys=["case_id"], update=[])
            _upsert(conn, s.leads,
                    [{"lead_id": lead.id, "kind": lead.kind, "value": lead.value, "created_at": now} for lead in unique],
                    keys=["lead_id"], update=[])
            _upsert(conn, s.case_leads,
                    [{"case_id": case_id, "lead_id": lead.id, "added_at": now} for lead in unique],
                    keys=["case_id", "lead_id"], update=[])
            delivered = set(
                conn.scalars(
                    select(s.inbox.c.lead_id).where(
                        s.inbox.c.webhook_id == webhook_id, s.inbox.c.lead_id.in_([lead.id for lead in unique])
                    )
                )
            )
            fresh = [lead for lead in unique if lead.id not in delivered]
            if fresh:
                conn.execute(
                    s.inbox.insert(),
                    [
                        {
                            "webhook_id": webhook_id,
                            "case_id": case_id,
                            "lead_id": lead.id,
                            "sources": sources_json,
                            "priority_class": priority_class,
                            "received_at": now,
                        }
                        for lead in fresh
                    ],
                )
        return AcceptResult(accepted=[lead.id for lead in fresh], duplicates=sorted(delivered))

    def inbox_after(self, cursor: int, *, limit: int) -> list[InboxItem]:
        """Inbox rows with id above `cursor`, oldest first, at most `limit`."""
        query = (
            select(s.inbox, s.leads.c.kind, s.leads.c.value)
            .join(s.leads, s.leads.c.lead_id == s.inbox.c.lead_id)
            .where(s.inbox.c.id > cursor)
            .order_by(s.inbox.c.id)
            .limit(limit)
        )
        with self.engine.begin() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            InboxItem(
                id=row["id"],
                webhook_id=row["webhook_id"],
                case_id=row["case_id"],
                lead=Lead(row["kind"], row["value"]),
                sources=json.loads(row["sources"]) if row["sources"] else None,
                priority_class=row["priority_class"],
                received_at=row["received_at"],
            )
            for row in rows
        ]

    def last_inbox_id(self) -> int:
        """The id of the newest inbox row (0 for an empty inbox): one index look-up, cheap to poll."""
        with self.engine.begin() as conn:
            return conn.execute(select(func.max(s.inbox.c.id))).scalar() or 0

    def get_lead(self, lead_id: str) -> Lead | None:
        with self.engine.begin() as conn:
            row = conn.execute(select(s.leads.c.kind, s.leads.c.value).where(s.leads.c.lead_id == lead_id)).first()
        return Lead(row.kind, row.value) if row else None

    def add_lead(self, lead: Lead, *, case_id: str | None = None, now: datetime | None = None) -> None:
        """Register a lead directly (CLI, tests), optionally in a case, without queueing a collection."""
        self.add_leads([lead], case_id=case_id, now=now)

    def add_leads(self, leads: Sequence[Lead], *, case_id: str | None = None, now: datetime | None = None) -> int:
        """Register leads in one transaction (idempotent by lead id), optionally in a case; return how
        many were given, each once. No collection is queued."""
        now = now or utcnow()
        unique = list({lead.id: lead for lead in leads}.values())
        if not unique:
            return 0
        with self.engine.begin() as conn:
            _upsert(conn, s.leads, [{"lead_id": lead.id, "kind": lead.kind, "value": lead.value, "created_at": now}
                                    for lead in unique], keys=["lead_id"], update=[])
            if case_id:
                _upsert(conn, s.cases, [{"case_id": case_id, "status": "active", "created_at": now, "updated_at": now}],
                        keys=["case_id"], update=[])
                _upsert(conn, s.case_leads, [{"case_id": case_id, "lead_id": lead.id, "added_at": now}
                                             for lead in unique], keys=["case_id", "lead_id"], update=[])
        return len(unique)

    def leads_overview(self) -> list[dict[str, Any]]:
        """Every lead with its cases and, per source, the last collection outcome and success time."""
        with self.engine.begin() as conn:
            lead_rows = conn.execute(select(s.leads).order_by(s.leads.c.created_at, s.leads.c.lead_id)).mappings().all()
            links = conn.execute(select(s.case_leads.c.lead_id, s.case_leads.c.case_id)).all()
            colls = conn.execute(select(s.collections)).mappings().all()
        cases_of: dict[str, list[str]] = {}
        for lead_id, case_id in links:
            cases_of.setdefault(lead_id, []).append(case_id)
        colls_of: dict[str, dict[str, dict[str, Any]]] = {}
        for row in colls:
            colls_of.setdefault(row["lead_id"], {})[row["source"]] = dict(row)
        return [
            {
                "lead_id": row["lead_id"],
                "kind": row["kind"],
                "value": row["value"],
                "cases": sorted(cases_of.get(row["lead_id"], [])),
                "collections": colls_of.get(row["lead_id"], {}),
            }
            for row in lead_rows
        ]

    def set_case_status(self, case_id: str, status: str, *, now: datetime | None = None) -> bool:
        """Close or re-open a case; return whether it changed. A closed case's leads stop being
        monitored unless another active case holds them."""
        if status not in ("active", "closed"):
            raise ValueError(f"case status must be active or closed, not {status!r}")
        with self.engine.begin() as conn:
            current = conn.execute(select(s.cases.c.status).where(s.cases.c.case_id == case_id)).scalar()
            if current is None:
                raise KeyError(f"unknown case {case_id!r}")
            if current == status:
                return False
            conn.execute(s.cases.update().where(s.cases.c.case_id == case_id)
                         .values(status=status, updated_at=now or utcnow()))
            return True

    def cases_overview(self) -> list[dict[str, Any]]:
        """Every case with its status and how many leads it holds."""
        query = (
            select(s.cases, func.count(s.case_leads.c.lead_id).label("leads"))
            .select_from(s.cases.outerjoin(s.case_leads, s.case_leads.c.case_id == s.cases.c.case_id))
            .group_by(*s.cases.c)
            .order_by(s.cases.c.created_at, s.cases.c.case_id)
        )
        with self.engine.begin() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def stale_monitored(
        self, source: str, *, lead_kinds: Sequence[str], older_than: datetime, limit: int
    ) -> list[str]:
        """Leads due a recurring crawl by `source`, stalest first.

        Monitored: in at least one active case, collected by this source before, not dead-lettered
        there (a human decides about those) and not already waiting or running for it. Due: its last
        success (or, never having succeeded, its last attempt) is older than `older_than`.
        """
        c, q, dl = s.collections, s.collection_queue, s.dead_letters
        active = (
            select(s.case_leads.c.lead_id)
            .join(s.cases, s.cases.c.case_id == s.case_leads.c.case_id)
            .where(s.cases.c.status == "active")
        )
        pending = select(q.c.lead_id).where(q.c.source == source, q.c.state != "done")
        dead = select(dl.c.lead_id).where(dl.c.source == source)
        last = func.coalesce(c.c.last_success_at, c.c.last_attempt_at)
        query = (
            select(c.c.lead_id)
            .join(s.leads, s.leads.c.lead_id == c.c.lead_id)
            .where(
                c.c.source == source,
                s.leads.c.kind.in_(list(lead_kinds)),
                last < older_than,
                c.c.lead_id.in_(active),
                c.c.lead_id.not_in(pending),
                c.c.lead_id.not_in(dead),
            )
            .order_by(last, c.c.lead_id)
            .limit(limit)
        )
        with self.engine.begin() as conn:
            return list(conn.scalars(query))

    def all_lead_ids(self, *, kinds: Sequence[str]) -> list[str]:
        """Every lead of these kinds, oldest first (what a full backfill of a source covers)."""
        query = select(s.leads.c.lead_id).where(s.leads.c.kind.in_(list(kinds))).order_by(
            s.leads.c.created_at, s.leads.c.lead_id)
        with self.engine.begin() as conn:
            return list(conn.scalars(query))

    def lead_ids_since(self, since: datetime | None) -> list[str]:
        """The leads registered at or after `since` (every lead when None), oldest first: what the
        Dagster layer adds to the `leads` partitions as leads join the fleet."""
        query = select(s.leads.c.lead_id).order_by(s.leads.c.created_at, s.leads.c.lead_id)
        if since is not None:
            query = query.where(s.leads.c.created_at >= since)
        with self.engine.begin() as conn:
            return list(conn.scalars(query))

    # -- fetch log --------------------------------------------------------------------------------

    def record_fetch(self, event: FetchEvent) -> None:
        """Append one request to the fetch log (the fetcher's sink)."""
        self.record_fetches([event])

    def record_fetches(self, events: Iterable[FetchEvent]) -> None:
        rows = [
            {
                "source": e.source,
                "lead_id": e.lead_id,
                "identity_id": e.identity_id,
                "run_id": e.run_id,
                "method": e.method,
                "url": e.url,
                "status": e.status,
                "outcome": str(e.outcome),
                "latency_ms": e.latency_ms,
                "bytes": e.bytes,
                "attempt": e.attempt,
                "error": e.error,
                "at": e.at,
            }
            for e in events
        ]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(s.fetch_log.insert(), rows)

    def fetch_log(self, *, source: str | None = None, lead_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        query = select(s.fetch_log).order_by(s.fetch_log.c.id).limit(limit)
        if source:
            query = query.where(s.fetch_log.c.source == source)
        if lead_id:
            query = query.where(s.fetch_log.c.lead_id == lead_id)
        with self.engine.begin() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    def fleet_summary(self, *, since: datetime) -> list[dict[str, Any]]:
        """Per source since `since`: requests, outcome counts, mean latency, bytes, last request time."""
        fl = s.fetch_log
        query = (
            select(
                fl.c.source,
                fl.c.outcome,
                func.count().label("requests"),
                func.avg(fl.c.latency_ms).label("latency_ms"),
                func.sum(fl.c.bytes).label("bytes"),
                func.max(fl.c.at).label("last_at"),
            )
            .where(fl.c.at >= since)
            .group_by(fl.c.source, fl.c.outcome)
        )
        summary: dict[str, dict[str, Any]] = {}
        with self.engine.begin() as conn:
            for row in conn.execute(query).mappings():
                entry = summary.setdefault(
                    row["source"],
                    {"source": row["source"], "requests": 0, "outcomes": {}, "bytes": 0, "latency_ms": 0.0,
                     "last_at": None},
                )
                # Mean over all outcomes, weighted by each outcome's request count.
                total = entry["requests"] + row["requests"]
                entry["latency_ms"] = (entry["latency_ms"] * entry["requests"]
                                       + float(row["latency_ms"] or 0) * row["requests"]) / total
                entry["requests"] = total
                entry["outcomes"][row["outcome"]] = row["requests"]
                entry["bytes"] += int(row["bytes"] or 0)
                entry["last_at"] = max(filter(None, [entry["last_at"], row["last_at"]]), default=None)
        return [summary[name] for name in sorted(summary)]

    # -- the collection queue (the fleet's own backlog) -------------------------------------------

    def enqueue(
        self,
        items: Iterable[tuple[str, str]],
        *,
        origin: str,
        priority_class: str,
        case_id: str | None = None,
        not_before: datetime | None = None,
        now: datetime | None = None,
    ) -> int:
        """Queue (source, lead) collections once per origin; return how many were new.

        The origin makes it idempotent: the same inbox row or requeue request queued twice is one row.
        """
        now = now or utcnow()
        rows = [
            {
                "source": source,
                "lead_id": lead_id,
                "origin": origin,
                "priority_class": priority_class,
                "case_id": case_id,
                "state": "queued",
                "not_before": not_before or now,
                "enqueued_at": now,
            }
            for source, lead_id in dict.fromkeys(items)
        ]
        if not rows:
            return 0
        with self.engine.begin() as conn:
            return len(_insert_new(conn, s.collection_queue, rows, keys=["source", "lead_id", "origin"]))

    def pending_leads(self, source: str, lead_ids: Sequence[str]) -> set[str]:
        """Those of `lead_ids` with a collection by `source` queued or dispatched."""
        q = s.collection_queue
        query = select(q.c.lead_id).where(q.c.source == source, q.c.state != "done", q.c.lead_id.in_(list(lead_ids)))
        with self.engine.begin() as conn:
            return set(conn.scalars(query))

    def queue_depths(self, *, now: datetime | None = None) -> dict[str, dict[str, int]]:
        """Per source: collections queued and ready, queued but waiting (not_before), dispatched, and
        of those ready and of those dispatched, how many are interactive."""
        now = now or utcnow()
        q = s.collection_queue
        waiting = (q.c.state == "queued") & (q.c.not_before > now)
        interactive = q.c.priority_class == "interactive"
        query = (
            select(q.c.source, q.c.state, waiting, interactive, func.count())
            .where(q.c.state != "done")
            .group_by(q.c.source, q.c.state, waiting, interactive)
        )
        depths: dict[str, dict[str, int]] = {}
        with self.engine.begin() as conn:
            for source, state, is_waiting, is_interactive, count in conn.execute(query):
                entry = depths.setdefault(source, dict.fromkeys(QUEUE_DEPTH_KEYS, 0))
                key = "dispatched" if state == "dispatched" else ("waiting" if is_waiting else "ready")
                entry[key] += count
                if is_interactive and key != "waiting":
                    entry[f"{key}_interactive"] += count
        return depths

    def dispatch(
        self, source: str, *, limit: int, now: datetime | None = None, classes: Sequence[str] | None = None
    ) -> list[QueuedCollection]:
        """Take up to `limit` ready collections of `source` (of these priority `classes`, default all),
        highest priority first, and mark them dispatched. A lead already dispatched for this source is
        not dispatched twice at once."""
        if limit <= 0:
            return []
        now = now or utcnow()
        q = s.collection_queue
        with self.engine.begin() as conn:
            busy = select(q.c.lead_id).where(q.c.source == source, q.c.state == "dispatched")
            query = (
                select(q)
                .where(q.c.source == source, q.c.state == "queued", q.c.not_before <= now, q.c.lead_id.not_in(busy))
                .order_by(_queue_rank(), q.c.id)
                .limit(limit * 4)
            )
            if classes is not None:
                query = query.where(q.c.priority_class.in_(list(classes)))
            if conn.dialect.name == "postgresql":
                query = query.with_for_update(skip_locked=True)
            picked: list[dict[str, Any]] = []
            seen: set[str] = set()
            for row in conn.execute(query).mappings():
                if row["lead_id"] not in seen:
                    seen.add(row["lead_id"])
                    picked.append(dict(row))
                if len(picked) == limit:
                    break
            if picked:
                conn.execute(
                    q.update().where(q.c.id.in_([row["id"] for row in picked]))
                    .values(state="dispatched", dispatched_at=now, handover_key=None)
                )
        return [_queued({**row, "state": "dispatched", "dispatched_at": now}) for row in picked]

    def assign_handover(self, row_ids: Sequence[int], *, handover_key: str) -> None:
        """Name the run that dispatched rows go out in (see `handover_leads`)."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            for start in range(0, len(row_ids), 500):
                conn.execute(q.update().where(q.c.id.in_(list(row_ids[start:start + 500])))
                             .values(handover_key=handover_key))

    def handover_leads(self, handover_key: str) -> list[str]:
        """The leads a run still owes: its rows that are dispatched, in queue order. A lead the run
        already finished or parked, or that went out again in another run, is not among them."""
        return list(dict.fromkeys(row.lead_id for row in self.handover_rows(handover_key)))

    def handover_rows(self, handover_key: str) -> list[QueuedCollection]:
        """The rows a run still owes (dispatched under its key), in queue order."""
        q = s.collection_queue
        query = select(q).where(q.c.handover_key == handover_key, q.c.state == "dispatched").order_by(q.c.id)
        with self.engine.begin() as conn:
            return [_queued(dict(row)) for row in conn.execute(query).mappings()]

    def requeue_after_run_death(self, row_ids: Sequence[int]) -> int:
        """Dispatched rows whose run died go back to the queue, ready now, one more death counted."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            result = conn.execute(
                q.update().where(q.c.id.in_(list(row_ids)), q.c.state == "dispatched")
                .values(state="queued", dispatched_at=None, handover_key=None, outcome="run_died",
                        run_deaths=q.c.run_deaths + 1)
            )
        return result.rowcount

    def finish_dispatched(self, source: str, lead_id: str, *, outcome: str, now: datetime | None = None) -> int:
        """Close every dispatched row of (source, lead), and any queued duplicate it satisfied."""
        now = now or utcnow()
        with self.engine.begin() as conn:
            return _finish_dispatched(conn, source, lead_id, outcome=outcome, now=now)

    def park_dispatched(self, source: str, lead_id: str, *, until: datetime, reason: str | None = None) -> int:
        """Put the dispatched rows of (source, lead) back in the queue, ready again at `until`, with
        the reason it waits (a throttling source, a full rate lane, no identity)."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            result = conn.execute(
                q.update()
                .where(q.c.source == source, q.c.lead_id == lead_id, q.c.state == "dispatched")
                .values(state="queued", not_before=until, dispatched_at=None, handover_key=None, outcome="parked",
                        park_reason=reason[:500] if reason else None)
            )
        return result.rowcount

    def park_reasons(self, source: str | None = None) -> dict[str, int]:
        """How many queued collections wait after being parked, by reason (the fleet view shows it)."""
        q = s.collection_queue
        query = (select(q.c.park_reason, func.count()).where(q.c.state == "queued", q.c.outcome == "parked")
                 .group_by(q.c.park_reason))
        if source is not None:
            query = query.where(q.c.source == source)
        with self.engine.begin() as conn:
            return {reason or "unknown": count for reason, count in conn.execute(query)}

    def release_stale_dispatches(self, *, older_than: datetime) -> int:
        """Dispatched rows whose run never reported back (a lost tick) go back to the queue. The
        dispatcher hands them over again under a new run key (Dagster never starts a key twice); a
        run that died is noticed sooner, from Dagster's run records (see `release_dead_run`)."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            result = conn.execute(
                q.update()
                .where(q.c.state == "dispatched", q.c.dispatched_at < older_than)
                .values(state="queued", dispatched_at=None, handover_key=None)
            )
        return result.rowcount


    def dispatched_handovers(self, *, dispatched_before: datetime, limit: int = 500) -> list[str]:
        """Handover keys with rows still dispatched under them since before `dispatched_before`."""
        q = s.collection_queue
        query = (select(q.c.handover_key).where(q.c.state == "dispatched", q.c.handover_key.is_not(None),
                                                q.c.dispatched_at < dispatched_before)
                 .group_by(q.c.handover_key).order_by(func.min(q.c.dispatched_at)).limit(limit))
        with self.engine.begin() as conn:
            return list(conn.scalars(query))

    def release_handovers(self, handover_keys: Sequence[str], *, dispatched_before: datetime) -> int:
        """Rows dispatched under these keys (since before `dispatched_before`) go back to the queue,
        ready now, no run death counted; rows a dispatch claimed without a key yet go back too."""
        q = s.collection_queue
        orphaned: ColumnElement[bool] = q.c.handover_key.is_(None)
        if handover_keys:
            orphaned = orphaned | q.c.handover_key.in_(list(handover_keys))
        with self.engine.begin() as conn:
            result = conn.execute(
                q.update().where(q.c.state == "dispatched", q.c.dispatched_at < dispatched_before, orphaned)
                .values(state="queued", dispatched_at=None, handover_key=None)
            )
        return result.rowcount

    # -- collections and dead letters -------------------------------------------------------------

    def record_collection(
        self,
        *,
        source: str,
        lead_id: str,
        outcome: str,
        records: int,
        content_hash: str | None,
        path: str | None,
        run_id: str | None,
        now: datetime | None = None,
        common_fields: Sequence[str] | None = None,
    ) -> None:
        """Note the latest attempt at a collection; a success also clears its dead letter.

        `common_fields`: the fields every record of a successful collection carried (kept only when
        it found records, for the schema-drift check)."""
        now = now or utcnow()
        with self.engine.begin() as conn:
            _record_collection(conn, source=source, lead_id=lead_id, outcome=outcome, records=records,
                               content_hash=content_hash, path=path, run_id=run_id, now=now,
                               common_fields=common_fields)

    def complete_collection(
        self,
        *,
        source: str,
        lead_id: str,
        outcome: str,
        records: int,
        content_hash: str | None,
        path: str | None,
        run_id: str | None,
        now: datetime | None = None,
        common_fields: Sequence[str] | None = None,
    ) -> int:
        """The bookkeeping of a finished collection in one transaction: `record_collection` and
        `finish_dispatched` together, so a process killed after the records were written leaves
        either both done or neither (the queue row still dispatched: the collection runs again and
        stores the same records once). Returns the queue rows closed."""
        now = now or utcnow()
        with self.engine.begin() as conn:
            _record_collection(conn, source=source, lead_id=lead_id, outcome=outcome, records=records,
                               content_hash=content_hash, path=path, run_id=run_id, now=now,
                               common_fields=common_fields)
            return _finish_dispatched(conn, source, lead_id, outcome=outcome, now=now)

    def collection(self, source: str, lead_id: str) -> Collection | None:
        with self.engine.begin() as conn:
            row = conn.execute(
                select(s.collections).where(s.collections.c.source == source, s.collections.c.lead_id == lead_id)
            ).mappings().first()
        return Collection(**row) if row else None

    # -- what the degradation checks compare with -------------------------------------------------

    def recent_collections(self, source: str, *, kind: str, limit: int, exclude: Sequence[str] = ()
                           ) -> list[tuple[int, list[str] | None]]:
        """The latest successful collections by `source` of `kind` leads, newest first: each one's
        record count and common fields (None when not known). A source's own baseline."""
        c = s.collections
        query = (
            select(c.c.records, c.c.common_fields)
            .join(s.leads, s.leads.c.lead_id == c.c.lead_id)
            .where(c.c.source == source, s.leads.c.kind == kind, c.c.outcome.in_(["ok", "empty"]))
            .order_by(c.c.last_attempt_at.desc())
            .limit(limit)
        )
        if exclude:
            query = query.where(c.c.lead_id.not_in(list(exclude)))
        with self.engine.begin() as conn:
            return [(row.records, json.loads(row.common_fields) if row.common_fields else None)
                    for row in conn.execute(query)]

    def collection_volume(self, source: str, *, since: datetime, until: datetime | None = None
                          ) -> tuple[int, int, int]:
        """Of the source's collections last attempted in [since, until): how many answered (ok or
        empty), how many of those were empty, and the records they stored."""
        c = s.collections
        answered = c.c.outcome.in_(["ok", "empty"])
        query = select(func.count(), func.sum(case((c.c.outcome == "empty", 1), else_=0)),
                       func.coalesce(func.sum(c.c.records), 0)).where(
            c.c.source == source, c.c.last_attempt_at >= since, answered)
        if until is not None:
            query = query.where(c.c.last_attempt_at < until)
        with self.engine.begin() as conn:
            count, empty, records = conn.execute(query).one()
        return int(count), int(empty or 0), int(records)

    def monitored_freshness(self, source: str, *, lead_kinds: Sequence[str]) -> list[tuple[str, datetime | None]]:
        """Every lead `source` monitors (in an active case, of a kind it takes) with the time it was
        last collected WITH records (None: never, or its latest answer was empty or failed)."""
        c = s.collections
        active = (
            select(s.case_leads.c.lead_id)
            .join(s.cases, s.cases.c.case_id == s.case_leads.c.case_id)
            .where(s.cases.c.status == "active")
        )
        with_records = and_(c.c.outcome == "ok", c.c.records > 0)
        query = (
            select(s.leads.c.lead_id, c.c.last_success_at, with_records.label("with_records"))
            .select_from(s.leads.outerjoin(c, and_(c.c.lead_id == s.leads.c.lead_id, c.c.source == source)))
            .where(s.leads.c.kind.in_(list(lead_kinds)), s.leads.c.lead_id.in_(active))
            .order_by(s.leads.c.lead_id)
        )
        with self.engine.begin() as conn:
            return [(row.lead_id, row.last_success_at if row.with_records else None) for row in conn.execute(query)]

    def fetch_profile(self, source: str, *, since: datetime, until: datetime | None = None
                      ) -> tuple[dict[str, int], float | None]:
        """The requests `source` sent in [since, until): counts by outcome, and the mean size of
        its usable (`ok`) answers in bytes (None when there were none)."""
        fl = s.fetch_log
        query = select(fl.c.outcome, func.count(), func.avg(fl.c.bytes)).where(
            fl.c.source == source, fl.c.at >= since).group_by(fl.c.outcome)
        if until is not None:
            query = query.where(fl.c.at < until)
        with self.engine.begin() as conn:
            rows = conn.execute(query).all()
        counts = {outcome: int(n) for outcome, n, _ in rows}
        ok_bytes = next((float(mean) for outcome, _, mean in rows if outcome == "ok" and mean is not None), None)
        return counts, ok_bytes

    def put_dead_letter(
        self,
        *,
        source: str,
        lead_id: str,
        reason_group: str,
        last_status: int | None,
        attempts: int,
        last_error: str | None,
        now: datetime | None = None,
    ) -> None:
        """One row per (source, lead): a repeat failure updates it and adds to its attempts."""
        now = now or utcnow()
        row = {
            "source": source,
            "lead_id": lead_id,
            "reason_group": reason_group,
            "last_status": last_status,
            "attempts": attempts,
            "last_error": last_error,
            "first_seen": now,
            "last_seen": now,
        }
        with self.engine.begin() as conn:
            existing = conn.execute(
                select(s.dead_letters.c.attempts).where(
                    s.dead_letters.c.source == source, s.dead_letters.c.lead_id == lead_id
                )
            ).scalar()
            if existing is not None:
                row["attempts"] = existing + attempts
            _upsert(conn, s.dead_letters, [row], keys=["source", "lead_id"],
                    update=["reason_group", "last_status", "attempts", "last_error", "last_seen"])

    def requeue_dead_letters(
        self,
        *,
        source: str | None = None,
        reason_group: str | None = None,
        lead_id: str | None = None,
        priority_class: str = "recurring",
        now: datetime | None = None,
    ) -> list[DeadLetter]:
        """Queue the matching dead letters for another collection; return the ones newly queued.

        Idempotent: the queue origin names the failure (its last_seen), so requeueing twice queues
        once, while a letter that failed again after its requeue can be requeued again.
        """
        queued = []
        for letter in self.dead_letters(source=source, reason_group=reason_group, lead_id=lead_id):
            origin = f"requeue:{letter.last_seen.isoformat()}"
            if self.enqueue([(letter.source, letter.lead_id)], origin=origin, priority_class=priority_class, now=now):
                queued.append(letter)
        return queued

    def requeued_dead_letters(self) -> set[tuple[str, str]]:
        """(source, lead) pairs whose dead letter has a requeued collection still waiting or running."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(q.c.source, q.c.lead_id).where(q.c.origin.like("requeue:%"), q.c.state != "done")
            ).all()
        return {(row.source, row.lead_id) for row in rows}

    def dead_letters(
        self, *, source: str | None = None, reason_group: str | None = None, lead_id: str | None = None
    ) -> list[DeadLetter]:
        query = select(s.dead_letters).order_by(s.dead_letters.c.last_seen.desc(), s.dead_letters.c.source)
        if source:
            query = query.where(s.dead_letters.c.source == source)
        if reason_group:
            query = query.where(s.dead_letters.c.reason_group == reason_group)
        if lead_id:
            query = query.where(s.dead_letters.c.lead_id == lead_id)
        with self.engine.begin() as conn:
            return [DeadLetter(**row) for row in conn.execute(query).mappings()]


# Interactive work first, then recurring, then backfill; the queue sorts on this rank.
PRIORITY_RANK = {"interactive": 0, "recurring": 1, "backfill": 2}


def _queue_rank():  # noqa: ANN202 - a SQL expression
    from sqlalchemy import case

    return case(PRIORITY_RANK, value=s.collection_queue.c.priority_class, else_=len(PRIORITY_RANK))


def _record_collection(conn: Connection, *, source: str, lead_id: str, outcome: str, records: int,
                       content_hash: str | None, path: str | None, run_id: str | None, now: datetime,
                       common_fields: Sequence[str] | None = None) -> None:
    succeeded = outcome != "failed"
    row = {
        "source": source,
        "lead_id": lead_id,
        "outcome": outcome,
        "records": records,
        "content_hash": content_hash,
        "path": path,
        "run_id": run_id,
        "last_attempt_at": now,
        "last_success_at": now if succeeded else None,
        "common_fields": json.dumps(sorted(common_fields)) if common_fields is not None and records else None,
    }
    update = ["outcome", "run_id", "last_attempt_at"]
    if succeeded:
        update += ["records", "content_hash", "path", "last_success_at"]
        if records:
            update.append("common_fields")
    _upsert(conn, s.collections, [row], keys=["source", "lead_id"], update=update)
    if succeeded:
        conn.execute(
            delete(s.dead_letters).where(and_(s.dead_letters.c.source == source, s.dead_letters.c.lead_id == lead_id))
        )


def _finish_dispatched(conn: Connection, source: str, lead_id: str, *, outcome: str, now: datetime) -> int:
    q = s.collection_queue
    states = ["dispatched", "queued"] if outcome in ("ok", "empty") else ["dispatched"]
    result = conn.execute(
        q.update()
        .where(q.c.source == source, q.c.lead_id == lead_id, q.c.state.in_(states), q.c.enqueued_at <= now)
        .values(state="done", finished_at=now, outcome=outcome)
    )
    return result.rowcount


def _queued(row: dict[str, Any]) -> QueuedCollection:
    return QueuedCollection(**{f.name: row[f.name] for f in fields(QueuedCollection)})


def _insert_new(conn: Connection, table: Table, rows: list[dict[str, Any]], *, keys: list[str]) -> list[Any]:
    """Insert rows whose key is new; return the primary keys of the rows actually inserted."""
    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = dialect_insert(table).on_conflict_do_nothing(index_elements=keys).returning(*table.primary_key.columns)
    return [row[0] for row in conn.execute(stmt, rows)]


def _upsert(conn: Connection, table: Table, rows: list[dict[str, Any]], *, keys: list[str], update: list[str]) -> None:
    """Insert rows; on a key conflict update `update` columns, or leave the row alone when empty."""
    if not rows:
        return
    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = dialect_insert(table)
    if update:
        stmt = stmt.on_conflict_do_update(index_elements=keys, set_={c: stmt.excluded[c] for c in update})
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=keys)
    conn.execute(stmt, rows)
