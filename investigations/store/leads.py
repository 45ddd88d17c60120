"""Leads, cases and the webhook inbox: what investigators asked about, and in what order it arrived."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, or_, select, text, union

from investigations.intake.leads import Lead
from investigations.store import schema as s
from investigations.store.sql import Tables, upsert, utcnow

_INBOX_LOCK_KEY = 0x1B0C5  # serializes intake commits on Postgres so inbox ids follow commit order
# The queue states of a collection still owed to its lead (the others: done).
_OWED_STATES = ("queued", "dispatched")
# A lead's Dagster partition key: `kind:value` for leads registered since schema version 14, its id
# for those registered before (their history in Dagster is under it) and for values no key can read.
_PARTITION_KEY = func.coalesce(s.leads.c.partition_key, s.leads.c.lead_id)


def _lead_row(lead: Lead, now: datetime) -> dict[str, Any]:
    key = lead.partition_key
    return {"lead_id": lead.id, "kind": lead.kind, "value": lead.value, "created_at": now,
            "partition_key": key if key != lead.id else None}


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



class LeadTables(Tables):
    """Leads, cases and the inbox."""

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
            upsert(conn, s.cases, [{"case_id": case_id, "status": "active", "created_at": now, "updated_at": now}],
                    keys=["case_id"], update=[])
            upsert(conn, s.leads, [_lead_row(lead, now) for lead in unique], keys=["lead_id"], update=[])
            upsert(conn, s.case_leads,
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
        with self.reading() as conn:
            return conn.execute(select(func.max(s.inbox.c.id))).scalar() or 0

    def get_lead(self, lead_id: str) -> Lead | None:
        with self.engine.begin() as conn:
            row = conn.execute(select(s.leads.c.kind, s.leads.c.value).where(s.leads.c.lead_id == lead_id)).first()
        return Lead(row.kind, row.value) if row else None

    def get_lead_keyed(self, lead_id: str) -> tuple[Lead, str] | None:
        """The lead and its Dagster partition key, in one read (None: no such lead)."""
        with self.reading() as conn:
            row = conn.execute(select(s.leads.c.kind, s.leads.c.value, _PARTITION_KEY.label("key"))
                               .where(s.leads.c.lead_id == lead_id)).first()
        return (Lead(row.kind, row.value), row.key) if row else None

    def partition_keys_of(self, lead_ids: Sequence[str]) -> dict[str, str]:
        """The Dagster partition key of each registered lead among `lead_ids`, by id, in one read per
        500 (`kind:value`, or the id of a lead registered before readable keys)."""
        found: dict[str, str] = {}
        lead_ids = list(dict.fromkeys(lead_ids))
        with self.reading() as conn:
            for start in range(0, len(lead_ids), 500):
                query = select(s.leads.c.lead_id, _PARTITION_KEY.label("key")).where(
                    s.leads.c.lead_id.in_(lead_ids[start:start + 500]))
                found.update({row.lead_id: row.key for row in conn.execute(query)})
        return found

    def get_leads(self, lead_ids: Sequence[str]) -> dict[str, Lead]:
        """The registered leads among `lead_ids`, by id, in one read."""
        found: dict[str, Lead] = {}
        with self.reading() as conn:
            for start in range(0, len(lead_ids), 500):
                query = select(s.leads.c.lead_id, s.leads.c.kind, s.leads.c.value).where(
                    s.leads.c.lead_id.in_(list(lead_ids[start:start + 500])))
                found.update({row.lead_id: Lead(row.kind, row.value) for row in conn.execute(query)})
        return found

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
            upsert(conn, s.leads, [_lead_row(lead, now) for lead in unique], keys=["lead_id"], update=[])
            if case_id:
                upsert(conn, s.cases, [{"case_id": case_id, "status": "active", "created_at": now, "updated_at": now}],
                        keys=["case_id"], update=[])
                upsert(conn, s.case_leads, [{"case_id": case_id, "lead_id": lead.id, "added_at": now}
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
                # Its partition key in Dagster's UI (`kind:value`; an older lead's is its id).
                "partition_key": row["partition_key"] or row["lead_id"],
                # When it left Dagster's partitions (None: it is one); its history stays here.
                "retired_at": row["retired_at"],
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

    def case_lead_ids(self, case_id: str) -> list[str] | None:
        """The ids of the leads a case holds (sorted); None when there is no such case."""
        with self.engine.begin() as conn:
            if conn.execute(select(s.cases.c.case_id).where(s.cases.c.case_id == case_id)).first() is None:
                return None
            rows = conn.execute(select(s.case_leads.c.lead_id).where(s.case_leads.c.case_id == case_id)
                                .order_by(s.case_leads.c.lead_id))
            return [row.lead_id for row in rows]

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

    def partition_keys_since(self, since: datetime | None) -> list[str]:
        """The partition keys of the active leads registered at or after `since` (every lead when
        None), oldest first: what the Dagster layer adds to the `leads` partitions as leads join the fleet. Active: not retired,
        and held by an open case, by no case at all, or owed a collection; a lead whose cases are all
        closed already (registered into a case closed since) is left for the lifecycle to retire."""
        leads, links, cases, queue = s.leads, s.case_leads, s.cases, s.collection_queue
        open_cases = select(cases.c.case_id).where(cases.c.status == "active")
        held = select(links.c.lead_id).where(links.c.case_id.in_(open_cases))
        owed = select(queue.c.lead_id).where(queue.c.state.in_(_OWED_STATES))
        in_a_case = exists().where(links.c.lead_id == leads.c.lead_id)
        query = (select(_PARTITION_KEY)
                 .where(leads.c.retired_at.is_(None),
                        or_(~in_a_case, leads.c.lead_id.in_(held), leads.c.lead_id.in_(owed)))
                 .order_by(leads.c.created_at, leads.c.lead_id))
        if since is not None:
            query = query.where(leads.c.created_at >= since)
        with self.reading() as conn:
            return list(conn.scalars(query))

    # --- the partition lifecycle (sensors/lead_partitions.py) -------------------------------------

    def leads_to_retire(self, *, settled_before: datetime, idle_before: datetime, limit: int) -> dict[str, str]:
        """Leads that may leave Dagster's partitions, at most `limit`, each with its partition key (by
        lead id, read in the same query).

        Not retired yet, held by no open case, owed nothing (no queued or dispatched collection), and
        untouched since `settled_before`: registered, collected and (for a case's lead) its cases
        closed before it. A lead that no case ever held (registered for a backfill, say) also waits
        until it has been neither registered nor collected since `idle_before`.
        """
        leads, links, cases = s.leads, s.case_leads, s.cases
        queue, collections = s.collection_queue, s.collections
        # Driven from the cases (few), each one's leads read by its key, never a scan of every link.
        holding = select(cases.c.case_id).where(or_(cases.c.status == "active", cases.c.updated_at >= settled_before))
        held = select(links.c.lead_id).where(links.c.case_id.in_(holding))
        owed = select(queue.c.lead_id).where(queue.c.state.in_(_OWED_STATES))
        collected = select(collections.c.lead_id).where(collections.c.last_attempt_at >= settled_before)
        idle = select(collections.c.lead_id).where(collections.c.last_attempt_at >= idle_before)
        in_a_case = exists().where(links.c.lead_id == leads.c.lead_id)
        query = (
            select(leads.c.lead_id, _PARTITION_KEY)
            .where(
                leads.c.retired_at.is_(None),
                leads.c.created_at < settled_before,
                leads.c.lead_id.not_in(held),
                leads.c.lead_id.not_in(owed),
                leads.c.lead_id.not_in(collected),
                or_(in_a_case, (leads.c.created_at < idle_before) & leads.c.lead_id.not_in(idle)),
            )
            .limit(limit)  # in no order: a sort would read every candidate before the first
        )
        with self.reading() as conn:
            return {row[0]: row[1] for row in conn.execute(query)}

    def leads_to_revive(self, *, limit: int) -> dict[str, str]:
        """Retired leads that belong in Dagster's partitions again, at most `limit`, each with its
        partition key: an open case holds them (a case re-opened, or a new one took them up) or a
        collection is owed to them (a backfill or a requeued dead letter). Read from the open cases and
        the owed work, not every retired lead."""
        leads, links, cases, queue = s.leads, s.case_leads, s.cases, s.collection_queue
        open_cases = select(cases.c.case_id).where(cases.c.status == "active")
        by_case = (select(links.c.lead_id, _PARTITION_KEY)
                   .join(leads, leads.c.lead_id == links.c.lead_id)
                   .where(links.c.case_id.in_(open_cases), leads.c.retired_at.is_not(None)))
        by_work = (select(queue.c.lead_id, _PARTITION_KEY)
                   .join(leads, leads.c.lead_id == queue.c.lead_id)
                   .where(queue.c.state.in_(_OWED_STATES), leads.c.retired_at.is_not(None)))
        query = union(by_case, by_work).limit(limit)
        with self.reading() as conn:
            return {row[0]: row[1] for row in conn.execute(query)}

    def mark_retired(self, lead_ids: Sequence[str], *, now: datetime | None = None) -> None:
        """Record that these leads left Dagster's partitions (the caller removed them first)."""
        self._set_retired(lead_ids, now or utcnow())

    def mark_active(self, lead_ids: Sequence[str]) -> None:
        """Record that these leads are Dagster partitions again (the caller added them first)."""
        self._set_retired(lead_ids, None)

    def _set_retired(self, lead_ids: Sequence[str], retired_at: datetime | None) -> None:
        with self.engine.begin() as conn:
            for start in range(0, len(lead_ids), 500):
                conn.execute(s.leads.update().where(s.leads.c.lead_id.in_(list(lead_ids[start:start + 500])))
                             .values(retired_at=retired_at))

    def retired_lead_ids(self, lead_ids: Sequence[str]) -> set[str]:
        """Which of `lead_ids` are retired (not Dagster partitions now)."""
        found: set[str] = set()
        with self.reading() as conn:
            for start in range(0, len(lead_ids), 500):
                found.update(conn.scalars(select(s.leads.c.lead_id).where(
                    s.leads.c.lead_id.in_(list(lead_ids[start:start + 500])), s.leads.c.retired_at.is_not(None))))
        return found

    def lead_partition_counts(self) -> dict[str, int]:
        """How many registered leads are Dagster partitions (`active`) and how many are `retired`."""
        with self.reading() as conn:
            total = conn.execute(select(func.count()).select_from(s.leads)).scalar() or 0
            retired = conn.execute(select(func.count()).select_from(s.leads)
                                   .where(s.leads.c.retired_at.is_not(None))).scalar() or 0
        return {"active": total - retired, "retired": retired}

