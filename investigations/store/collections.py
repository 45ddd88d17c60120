"""Collections (the latest attempt at each source and lead) and what the degradation checks compare with."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, and_, case, delete, func, select

from investigations.store import schema as s
from investigations.store.queue import finish_dispatched_rows
from investigations.store.sql import Tables, dialect_insert, upsert, utcnow
from investigations.store.visits import record_visit


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



class CollectionTables(Tables):
    """Collections and their history."""

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
        change_prior_s: float | None = None,
    ) -> int:
        """The bookkeeping of a finished collection in one transaction: its latest attempt (a success
        also clears its dead letter), its lead's change history (`store.visits.record_visit`) and
        its dispatched queue rows closed together, so a process killed after the records were
        written leaves either both done or neither (the queue row still dispatched: the collection
        runs again and stores the same records once). Returns the queue rows closed.

        `common_fields`: the fields every record of a successful collection carried (kept only when
        it found records, for the schema-drift check). `change_prior_s`: the source's prior change
        interval (`recrawl.every`), to estimate the lead's rate of change again with its visit
        (None: the recurring planner estimates it)."""
        now = now or utcnow()
        with self.engine.begin() as conn:
            _record_collection(conn, source=source, lead_id=lead_id, outcome=outcome, records=records,
                               content_hash=content_hash, path=path, run_id=run_id, now=now,
                               common_fields=common_fields)
            record_visit(conn, source=source, lead_id=lead_id, outcome=outcome, records=records,
                         content_hash=content_hash, now=now, prior_s=change_prior_s)
            if records:
                _add_to_total(conn, source, records, now)
            return finish_dispatched_rows(conn, source, lead_id, outcome=outcome, now=now)

    def records_totals(self) -> dict[str, int]:
        """Each source's running total of the records its collections found (`source_totals`)."""
        with self.reading() as conn:
            return {row.source: int(row.records) for row in conn.execute(select(s.source_totals))}

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
    upsert(conn, s.collections, [row], keys=["source", "lead_id"], update=update)
    if succeeded:
        conn.execute(
            delete(s.dead_letters).where(and_(s.dead_letters.c.source == source, s.dead_letters.c.lead_id == lead_id))
        )


def _add_to_total(conn: Connection, source: str, records: int, now: datetime) -> None:
    """Add `records` to the source's running total (one row per source), in the collection's own
    transaction: a collection killed before its commit is not counted."""
    totals = s.source_totals
    stmt = dialect_insert(conn, totals).values(source=source, records=records, updated_at=now)
    conn.execute(stmt.on_conflict_do_update(index_elements=["source"], set_={
        "records": totals.c.records + stmt.excluded.records, "updated_at": stmt.excluded.updated_at}))
