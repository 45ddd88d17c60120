"""What the fleet spends per source, and the daily budget that holds background work back.

A request costs its source's `cost_per_request_usd` (an API's price per call, from `sources.yaml`)
plus what the identity it went out as costs: `cost_per_request_usd` and `cost_per_mb_usd` (per
1,000,000 bytes of answer) from the identities file, as the identity registry in the state store
keeps them. The direct identity costs nothing of its own. Spend is counted from the fetch log, so it
is what was actually sent: retries and throttled answers cost like any other request.

The budget gate: a source whose spend today (UTC) has reached its `daily_budget_usd` gets no more
background work (recurring crawls, backfills) until the next UTC day; interactive leads still go,
because an investigator is waiting on them. A budget of 0 means none. The gate lives in the
dispatcher (`investigations.scheduling.dispatch`), which asks `over_budget` of every source with a budget
and background work to hand over.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from investigations.sources.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore
from investigations.store import schema as s

BYTES_PER_MB = 1_000_000  # proxy providers bill decimal megabytes
BYTES_PER_GB = 1_000_000_000
# A fetch-log row is written as its request ends and stamped with that moment, so a row older than
# this that is not in the log yet never will be: today's usage up to then is final, and kept.
SETTLE_S = 60.0


@dataclass(frozen=True)
class Usage:
    """Requests one identity sent to one source over some period, and the bytes of their answers."""

    source: str
    identity_id: str
    requests: int
    bytes: int


@dataclass(frozen=True)
class IdentityPrice:
    """What one identity costs per request and per MB of answer (the direct identity: nothing)."""

    cost_per_request_usd: float = 0.0
    cost_per_mb_usd: float = 0.0


FREE = IdentityPrice()


def usage_cost_usd(usage: Usage, *, source_cost_per_request_usd: float, identity: IdentityPrice) -> float:
    """The price of `usage`: each request pays the source's and the identity's price per request,
    and the identity's price per MB of what came back."""
    per_request = source_cost_per_request_usd + identity.cost_per_request_usd
    return usage.requests * per_request + usage.bytes / BYTES_PER_MB * identity.cost_per_mb_usd


def spend_by_source(usage: Iterable[Usage], catalog: SourceCatalog,
                    prices: Mapping[str, IdentityPrice]) -> dict[str, float]:
    """Spend in USD per source of the catalog (0.0 for one that sent nothing). Usage of a source no
    longer in the catalog is left out; an identity without a price (direct) costs nothing itself."""
    specs = {spec.name: spec for spec in catalog.sources}
    spent = dict.fromkeys(specs, 0.0)
    for row in usage:
        spec = specs.get(row.source)
        if spec is not None:
            spent[row.source] += usage_cost_usd(row, source_cost_per_request_usd=spec.cost_per_request_usd,
                                                identity=prices.get(row.identity_id, FREE))
    return spent


def collection_cost_usd(spec: SourceSpec, sent: Mapping[str, tuple[int, int]],
                        prices: Mapping[str, IdentityPrice]) -> float:
    """What one collection cost: what it sent per identity, (requests, bytes of answer) as the
    collector counted it while the fetch log recorded the same requests, priced as `usage_cost_usd`
    prices them. Nothing is read back from the log, so a batch pays no query per lead."""
    return sum(usage_cost_usd(Usage(spec.name, identity, requests, size),
                              source_cost_per_request_usd=spec.cost_per_request_usd,
                              identity=prices.get(identity, FREE)) for identity, (requests, size) in sent.items())


def evidence_cost_usd(spec: SourceSpec, evidence_bytes: int) -> float:
    """What keeping the source's captures costs at its `evidence_usd_per_gb`."""
    return evidence_bytes / BYTES_PER_GB * spec.evidence_usd_per_gb


def day_start(now: datetime) -> datetime:
    """The start of `now`'s UTC day: budgets are per UTC day."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def over_budget(spec: SourceSpec, spent_today_usd: float) -> str | None:
    """Why `spec` gets no more background work today, or None while it is within its budget (or
    has none)."""
    if spec.daily_budget_usd <= 0 or spent_today_usd < spec.daily_budget_usd:
        return None
    return f"budget: spent {spent_today_usd:.2f} of {spec.daily_budget_usd:.2f} USD today"


def records_per_usd(records: int, spent_usd: float) -> float | None:
    """Throughput per unit of cost; None when nothing was spent (free sources have no such figure)."""
    return records / spent_usd if spent_usd > 0 else None


def identity_prices(store: StateStore) -> dict[str, IdentityPrice]:
    """Each registered identity's price, inactive ones included: their requests still cost."""
    i = s.identities
    with store.engine.begin() as conn:
        rows = conn.execute(select(i.c.identity_id, i.c.cost_per_request_usd, i.c.cost_per_mb_usd)).all()
    return {identity: IdentityPrice(per_request, per_mb) for identity, per_request, per_mb in rows}


def spend_today(store: StateStore, catalog: SourceCatalog, *, now: datetime) -> dict[str, float]:
    """Spend in USD per source since the start of `now`'s UTC day (what budgets are held against).
    Read incrementally (see `SpendMeter`): the dispatcher asks on every pass."""
    usage = meter_for(store).usage_today(store, catalog.names, now=now)
    return spend_by_source(usage, catalog, identity_prices(store))


class SpendMeter:
    """Today's usage per (source, identity), read incrementally from the fetch log.

    Summing a whole day of the log on every dispatch pass would cost more as the day goes on (about
    0.4 s at 100,000 requests on SQLite). The meter keeps the day's settled part (rows older than
    `settle_s`, which can no longer change) and reads only what came after it, by source and time on
    the log's (source, at) index. A new UTC day, a clock that went back, or another set of sources
    starts it over.
    """

    def __init__(self, *, settle_s: float = SETTLE_S) -> None:
        self._settle = timedelta(seconds=settle_s)
        self._lock = threading.Lock()
        self._sources: tuple[str, ...] = ()
        self._day: datetime | None = None
        self._settled_until: datetime | None = None
        self._requests: Counter[tuple[str, str]] = Counter()
        self._bytes: Counter[tuple[str, str]] = Counter()

    def usage_today(self, store: StateStore, sources: Sequence[str], *, now: datetime) -> list[Usage]:
        """Requests and bytes per (source, identity) of `sources` since `now`'s UTC day began, read
        from `store` (always the same database for one meter: see `meter_for`)."""
        day = day_start(now)
        with self._lock:
            if (day, tuple(sources)) != (self._day, self._sources) or (self._settled_until or day) > now:
                self._day, self._sources, self._settled_until = day, tuple(sources), day
                self._requests.clear()
                self._bytes.clear()
            start = self._settled_until or day
            boundary = max(start, now - self._settle)
            fl = s.fetch_log
            settled = (fl.c.at < boundary).label("settled")
            query = (
                select(fl.c.source, fl.c.identity_id, settled, func.count(), func.coalesce(func.sum(fl.c.bytes), 0))
                .where(fl.c.source.in_(list(sources)), fl.c.at >= start, fl.c.at < day + timedelta(days=1))
                .group_by(fl.c.source, fl.c.identity_id, settled)
            )
            requests, sizes = Counter(self._requests), Counter(self._bytes)
            with store.engine.begin() as conn:
                rows = conn.execute(query).all()
            for source, identity, is_settled, count, size in rows:
                requests[(source, identity)] += count
                sizes[(source, identity)] += int(size)
                if is_settled:
                    self._requests[(source, identity)] += count
                    self._bytes[(source, identity)] += int(size)
            self._settled_until = boundary
        return [Usage(source, identity, count, sizes[(source, identity)])
                for (source, identity), count in requests.items()]


# One meter per database the process talks to: stores are opened per run or tick, the day's
# settled usage outlives them.
_METERS: dict[tuple[str, str | None], SpendMeter] = {}
_METERS_LOCK = threading.Lock()


def meter_for(store: StateStore) -> SpendMeter:
    """The process's spend meter for `store`'s database."""
    key = (store.engine.url.render_as_string(hide_password=True), store.schema)
    with _METERS_LOCK:
        meter = _METERS.get(key)
        if meter is None:
            meter = _METERS[key] = SpendMeter()
        return meter
