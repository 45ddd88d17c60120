"""The fetch log: one row per request the fleet sent, whatever came of it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from investigations.collection.events import FetchEvent
from investigations.store import schema as s
from investigations.store.sql import Tables


class FetchLogTables(Tables):
    """The fetch log (the fetcher's sink)."""

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

    def runs_of_lead(self, lead_id: str, *, source: str | None = None) -> list[dict[str, Any]]:
        """Every Dagster run that collected the lead, oldest first: per (source, run), its first and last
        request for the lead and how many it sent, from the fetch log (a run of one lead, a batch, a UI
        backfill's run alike), and the run of the lead's latest collection per source even when it sent
        nothing (a collection that failed before its first request)."""
        fl, coll = s.fetch_log, s.collections
        sent = (select(fl.c.source, fl.c.run_id, func.min(fl.c.at).label("first_at"),
                       func.max(fl.c.at).label("last_at"), func.count().label("requests"))
                .where(fl.c.lead_id == lead_id, fl.c.run_id.is_not(None))
                .group_by(fl.c.source, fl.c.run_id))
        latest = select(coll.c.source, coll.c.run_id, coll.c.last_attempt_at).where(
            coll.c.lead_id == lead_id, coll.c.run_id.is_not(None))
        if source:
            sent, latest = sent.where(fl.c.source == source), latest.where(coll.c.source == source)
        with self.reading() as conn:
            rows = [dict(row) for row in conn.execute(sent).mappings()]
            seen = {(row["source"], row["run_id"]) for row in rows}
            rows += [{"source": row.source, "run_id": row.run_id, "first_at": row.last_attempt_at,
                      "last_at": row.last_attempt_at, "requests": 0}
                     for row in conn.execute(latest) if (row.source, row.run_id) not in seen]
        return sorted(rows, key=lambda row: (row["first_at"], row["source"], row["run_id"]))

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

