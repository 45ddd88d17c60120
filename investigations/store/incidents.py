"""Canary incidents: each source's latest canary pass and its current or last incident, and the leads
an incident's window left empty or failed (what is collected again once the source passes again)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime

from sqlalchemy import select

from investigations.store import schema as s
from investigations.store.sql import Tables, upsert


@dataclass(frozen=True)
class SourceIncident:
    """A source's canary record (one row of `source_incidents`): when its canaries were last seen
    passing, and its current or last incident. The rule that keeps it is
    `investigations.fleet.degradation.follow_canaries`."""

    source: str
    passed_at: datetime | None = None  # the latest canary collection seen passing
    started_at: datetime | None = None  # the incident's first failing canary collection (None: no incident yet)
    since: datetime | None = None  # the last canary collection seen passing before it (None: none known)
    ended_at: datetime | None = None  # the canary collection that passed again (None: still open)
    requeued_at: datetime | None = None  # when its window's empty and failed leads were queued again

    @property
    def open(self) -> bool:
        return self.started_at is not None and self.ended_at is None

    @property
    def awaiting_requeue(self) -> bool:
        """Ended, and its window's leads not all queued again yet."""
        return self.ended_at is not None and self.requeued_at is None

    @property
    def window_start(self) -> datetime | None:
        """Where the leads it may have emptied begin: just after the last pass before it, or (none
        known) at its first failing canary collection."""
        return self.since or self.started_at


class IncidentTables(Tables):
    """Canary incidents per source."""

    def source_incident(self, source: str) -> SourceIncident | None:
        with self.reading() as conn:
            query = select(s.source_incidents).where(s.source_incidents.c.source == source)
            row = conn.execute(query).mappings().first()
        return SourceIncident(**row) if row else None

    def save_source_incident(self, incident: SourceIncident) -> None:
        row = {f.name: getattr(incident, f.name) for f in fields(SourceIncident)}
        with self.engine.begin() as conn:
            upsert(conn, s.source_incidents, [row], keys=["source"], update=[k for k in row if k != "source"])

    def incident_leads(self, source: str, *, lead_kinds: Sequence[str], start: datetime, end: datetime, origin: str,
                       limit: int) -> list[str]:
        """Leads `source` monitors (in an active case, of a kind it takes) whose latest collection by
        it answered empty or failed in [start, end], stalest first; not those with a collection of it
        waiting or running, nor those already queued under `origin` (the incident's own)."""
        c, q = s.collections, s.collection_queue
        active = (
            select(s.case_leads.c.lead_id)
            .join(s.cases, s.cases.c.case_id == s.case_leads.c.case_id)
            .where(s.cases.c.status == "active")
        )
        taken = select(q.c.lead_id).where(q.c.source == source, (q.c.state != "done") | (q.c.origin == origin))
        query = (
            select(c.c.lead_id)
            .join(s.leads, s.leads.c.lead_id == c.c.lead_id)
            .where(
                c.c.source == source,
                s.leads.c.kind.in_(list(lead_kinds)),
                c.c.outcome.in_(["empty", "failed"]),
                c.c.last_attempt_at >= start,
                c.c.last_attempt_at <= end,
                c.c.lead_id.in_(active),
                c.c.lead_id.not_in(taken),
            )
            .order_by(c.c.last_attempt_at, c.c.lead_id)
            .limit(limit)
        )
        with self.reading() as conn:
            return list(conn.scalars(query))
