"""The collection queue: the fleet's own backlog, what Dagster was handed, and what came back."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Connection, and_, case, func, select

from investigations.store import schema as s
from investigations.store.sql import Tables, insert_new, upsert, utcnow

# What `queue_depths` counts per source (waiting: queued with a not_before still ahead).
QUEUE_DEPTH_KEYS = ("ready", "waiting", "dispatched", "ready_interactive", "dispatched_interactive")
# A row's outcome when its run died: while it was being collected (so it may be what killed the run),
# or before the run had begun it.
DIED_COLLECTING = "died_collecting"
RUN_DIED = "run_died"
# Interactive work first, then recurring, then backfill; the queue sorts on this rank.
PRIORITY_RANK = {"interactive": 0, "recurring": 1, "backfill": 2}


def _queue_rank():  # noqa: ANN202 - a SQL expression
    return case(PRIORITY_RANK, value=s.collection_queue.c.priority_class, else_=len(PRIORITY_RANK))


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
    started_at: datetime | None = None
    outcome: str | None = None  # of its last dispatch: parked, RUN_DIED, DIED_COLLECTING, ...



class QueueEntry(NamedTuple):
    """One collection to queue: the source, the lead, and where the request came from."""

    source: str
    lead_id: str
    origin: str
    priority_class: str
    case_id: str | None = None


class QueueTables(Tables):
    """The collection queue."""

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
        return self.enqueue_each([QueueEntry(source, lead_id, origin, priority_class, case_id)
                                  for source, lead_id in items], not_before=not_before, now=now)

    def enqueue_each(self, entries: Iterable[QueueEntry], *, not_before: datetime | None = None,
                     now: datetime | None = None) -> int:
        """Queue entries of several origins in one transaction (a tick's inbox rows); each is queued
        once per (source, lead, origin), as `enqueue` does. Returns how many were new."""
        now = now or utcnow()
        rows = [
            {
                "source": entry.source,
                "lead_id": entry.lead_id,
                "origin": entry.origin,
                "priority_class": entry.priority_class,
                "case_id": entry.case_id,
                "state": "queued",
                "not_before": not_before or now,
                "enqueued_at": now,
            }
            for entry in dict.fromkeys(entries)
        ]
        if not rows:
            return 0
        with self.engine.begin() as conn:
            return len(insert_new(conn, s.collection_queue, rows, keys=["source", "lead_id", "origin"]))

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
                    .values(state="dispatched", dispatched_at=now, handover_key=None, started_at=None)
                )
        return [_queued({**row, "state": "dispatched", "dispatched_at": now, "started_at": None}) for row in picked]

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

    def handover_rows(self, handover_key: str, *, known: Collection[int] = ()) -> list[QueuedCollection]:
        """The rows a run still owes (dispatched under its key), in queue order, but for the `known`
        ones (ids): an open run looks several times a second for what joined it among the hundreds it
        owes, so their ids are read first and only new rows in full."""
        q = s.collection_queue
        owed = and_(q.c.handover_key == handover_key, q.c.state == "dispatched")
        with self.reading() as conn:  # never the write lock
            if known:
                new = [row_id for (row_id,) in conn.execute(select(q.c.id).where(owed)) if row_id not in known]
                if not new:
                    return []
                owed = and_(owed, q.c.id.in_(new))
            return [_queued(dict(row)) for row in conn.execute(select(q).where(owed).order_by(q.c.id)).mappings()]

    def open_collector(self, handover_key: str, source: str, *, until_s: float) -> None:
        """Open (or keep open) the run of `handover_key` to fresh leads of `source` until `until_s`."""
        with self.engine.begin() as conn:
            upsert(conn, s.collectors, [{"handover_key": handover_key, "source": source, "open_until_s": until_s}],
                   keys=["handover_key"], update=["open_until_s"])

    def close_collector(self, handover_key: str) -> None:
        """Take no more fresh leads for the run of `handover_key`. Once this has returned, no lead is
        joined to it: whatever its handover owes now is all it will be handed."""
        with self.engine.begin() as conn:
            conn.execute(s.collectors.delete().where(s.collectors.c.handover_key == handover_key))

    def open_collectors(self, *, now_s: float) -> dict[str, list[tuple[str, int]]]:
        """Per source, the runs open to fresh leads now, each with how many collections it still owes,
        least loaded first."""
        c, q = s.collectors, s.collection_queue
        owed = (select(func.count()).where(q.c.handover_key == c.c.handover_key, q.c.state == "dispatched")
                .scalar_subquery())
        query = select(c.c.source, c.c.handover_key, owed).where(c.c.open_until_s > now_s).order_by(owed)
        found: dict[str, list[tuple[str, int]]] = {}
        with self.reading() as conn:
            for source, key, count in conn.execute(query):
                found.setdefault(source, []).append((key, count))
        return found

    def join_collector(self, handover_key: str, row_ids: Sequence[int], *, now_s: float) -> bool:
        """Hand dispatched rows to the open run of `handover_key`, if it is still open (True); else
        touch nothing (False). The run's row is locked while the rows are named, so a run closing at
        the same moment either sees them (it reads what it owes after it closed) or is not joined."""
        c, q = s.collectors, s.collection_queue
        with self.engine.begin() as conn:
            query = select(c.c.handover_key).where(c.c.handover_key == handover_key, c.c.open_until_s > now_s)
            if conn.dialect.name == "postgresql":
                query = query.with_for_update()
            if conn.execute(query).first() is None:
                return False
            for start in range(0, len(row_ids), 500):
                conn.execute(q.update().where(q.c.id.in_(list(row_ids[start:start + 500])), q.c.state == "dispatched")
                             .values(handover_key=handover_key))
        return True

    def mark_started(self, source: str, lead_id: str, *, now: datetime | None = None) -> None:
        """Record that a run began collecting (source, lead): if the run dies now, this row is one it
        may have died of (see `investigations.scheduling.dispatch.release_dead_run`)."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            conn.execute(q.update().where(q.c.source == source, q.c.lead_id == lead_id, q.c.state == "dispatched")
                         .values(started_at=now or utcnow()))

    def requeue_after_run_death(self, row_ids: Sequence[int], *, deaths: int = 1, outcome: str = RUN_DIED) -> int:
        """Dispatched rows whose run died go back to the queue, ready now, `deaths` more run deaths
        counted, with the `outcome` that says how (RUN_DIED, or DIED_COLLECTING: it was being
        collected when its run died)."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            result = conn.execute(
                q.update().where(q.c.id.in_(list(row_ids)), q.c.state == "dispatched")
                .values(state="queued", dispatched_at=None, handover_key=None, started_at=None, outcome=outcome,
                        run_deaths=q.c.run_deaths + deaths)
            )
        return result.rowcount

    def finish_dispatched(self, source: str, lead_id: str, *, outcome: str, now: datetime | None = None) -> int:
        """Close every dispatched row of (source, lead), and any queued duplicate it satisfied."""
        now = now or utcnow()
        with self.engine.begin() as conn:
            return finish_dispatched_rows(conn, source, lead_id, outcome=outcome, now=now)

    def park_dispatched(self, source: str, lead_id: str, *, until: datetime, reason: str | None = None) -> int:
        """Put the dispatched rows of (source, lead) back in the queue, ready again at `until`, with
        the reason it waits (a throttling source, a full rate lane, no identity)."""
        q = s.collection_queue
        with self.engine.begin() as conn:
            result = conn.execute(
                q.update()
                .where(q.c.source == source, q.c.lead_id == lead_id, q.c.state == "dispatched")
                .values(state="queued", not_before=until, dispatched_at=None, handover_key=None, started_at=None,
                        outcome="parked",
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
                .values(state="queued", dispatched_at=None, handover_key=None, started_at=None)
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
                .values(state="queued", dispatched_at=None, handover_key=None, started_at=None)
            )
        return result.rowcount


def finish_dispatched_rows(conn: Connection, source: str, lead_id: str, *, outcome: str, now: datetime) -> int:
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


