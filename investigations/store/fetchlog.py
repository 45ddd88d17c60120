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

