"""Dead letters: collections that kept failing, kept for a human to see and requeue."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from investigations.store import schema as s
from investigations.store.queue import QueueTables
from investigations.store.sql import upsert, utcnow


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



class DeadLetterTables(QueueTables):
    """Dead letters (requeued into the collection queue)."""

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
            upsert(conn, s.dead_letters, [row], keys=["source", "lead_id"],
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


