"""Fleet figures per source, computed from what the state store records, and a health verdict.

Read on demand (the CLI, `/metrics` on each scrape, the `fleet/health` asset), never counted in
memory: every process of the fleet writes the same tables, so any process can tell the whole truth.

Sources of each figure, over a window (default 15 min) unless said otherwise:

- requests, retries, failures, throttles/blocks and latency: the fetch log (one row per attempt);
- collections, records and empty answers: each (source, lead)'s latest attempt (`collections`), so
  a lead collected twice within the window counts once;
- backlog and in flight: the fleet's queue now; dead letters now; identities now;
- freshness: the monitored leads (in an active case, collected by the source before). Fresh means
  collected *with records* within the source's cadence: an empty answer is not fresh. On a fixed
  cadence that is `recrawl_every`; on a learned one each lead's own planned interval plus its grace,
  the rule of the `fresh_within_cadence` check (`degradation.freshness_verdict`);
- cadence: a fixed source's `recrawl_every`, or a learned source's median planned interval over its
  monitored leads, under the plan the recurring planner last stored (`cadence_plans`);
- spend: today (UTC) and over the window, priced by `investigations.scheduling.cost`.

Besides these window figures, `/metrics` reads cumulative totals (`FleetTotals`, through a
`TotalsReader`): every request of the fetch log and every collection the queue saw finish, since the
store began, so Prometheus computes rates over any range itself.

Pacing, now: each rate lane's configured rate, the rate it uses and the ceiling it learned
(`lane_standings`, from the lanes' rows).

The computing functions are pure over plain rows (`figures_for`, `health_of`, `identity_standings`,
`standings_of_lanes`); `fleet_figures` and `lane_standings` read the rows and call them. Only
freshness is summed up in SQL (`Freshness`): a fleet may monitor a great many leads, and a row for
each would cost more than the rest together. A source on a learned cadence is the exception: each of
its leads is held to its own interval, so one more query reads a row per monitored lead (its last
collection with records and its rate of change, with the source's stored plan), which gives both its
fresh leads and its cadence.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Connection, Row, and_, case, cast, func, select, type_coerce

from investigations.collection.events import Outcome
from investigations.evidence.captures import evidence_bytes_by_source
from investigations.fleet.degradation import freshness_verdict, lead_intervals_s
from investigations.pacing import GapSampler, RateLanes
from investigations.pacing.aimd import NEVER_CUT_S
from investigations.pacing.lanes import LaneState, identity_lane_name, source_lane
from investigations.scheduling.cadence import change_rate, planned_interval_s, prior_rate_per_s
from investigations.scheduling.cost import (
    Usage,
    evidence_cost_usd,
    identity_prices,
    records_per_usd,
    spend_by_source,
    spend_today,
)
from investigations.sources.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore, utcnow
from investigations.store import schema as s
from investigations.store.visits import decode_visits, stored_plan

DEFAULT_WINDOW_S = 900.0
# Per identity, the failures shown by `investigations identities` are counted over this long.
IDENTITY_FAILURES_WINDOW = timedelta(hours=24)

_FAILED = frozenset({Outcome.TRANSIENT.value, Outcome.PERMANENT.value})
_BLOCKED = frozenset({Outcome.THROTTLED.value, Outcome.BLOCKED.value})
IDENTITY_STATES = ("available", "leased", "resting", "retired")
# Every verdict `health_of` gives, best first.
HEALTH_STATES = ("ok", "idle", "stale", "stalled", "over_budget", "empty", "failing", "blocked")


# -- rows, as the store holds them ----------------------------------------------------------------


@dataclass(frozen=True)
class RequestRow:
    """One attempt in the fetch log."""

    source: str
    outcome: str
    attempt: int
    latency_ms: float
    identity_id: str = "direct"
    bytes: int = 0


@dataclass(frozen=True)
class CollectionRow:
    """The latest attempt at one (source, lead): ok (with records), empty, or failed."""

    source: str
    outcome: str
    records: int


@dataclass(frozen=True)
class Freshness:
    """A source's monitored leads, summed up in the store (there may be a great many)."""

    monitored: int = 0
    # Last success had records and is within the source's cadence (on a learned one: the lead's own
    # planned interval plus its grace, `degradation.stale_after_s`; set from the leads' rows).
    fresh: int = 0
    empty: int = 0  # last success stored nothing
    # The stalest lead's last success with records or, lacking one, when it joined the fleet: an
    # empty answer does not reset a lead's age.
    stalest_since: datetime | None = None


@dataclass(frozen=True)
class Cadence:
    """How often a source collects its monitored leads again, as operators read it.

    Fixed (`recrawl_every`: min = max): every lead every `interval_s`. Learned (`recrawl: {min, max}`):
    `interval_s` is the median planned interval of its monitored leads (None: none planned), under the
    plan the recurring planner stored at `planned_at` (None: not planned yet, so planned now);
    `budget_short`: the budget could not keep every lead within `max`, so every lead is at its max."""

    kind: str  # fixed | learned
    interval_s: float | None
    min_s: float
    max_s: float
    budget_short: bool = False
    planned_at: datetime | None = None

    @classmethod
    def fixed(cls, spec: SourceSpec) -> Cadence:
        return cls("fixed", spec.recrawl.min_s, spec.recrawl.min_s, spec.recrawl.max_s)

    def text(self) -> str:
        """`fixed 6h`; `learned ~14h`, the median planned interval (`learned -`: none planned), with
        `(short)` when the budget leaves every lead at its max."""
        if self.kind == "fixed":
            return f"fixed {every_text(self.min_s)}"
        if self.interval_s is None:
            return "learned -"
        return f"learned ~{every_text(self.interval_s)}" + (" (short)" if self.budget_short else "")


def every_text(seconds: float) -> str:
    """An interval in as few characters as reads well: `6h`, `14h`, `1.5d`, `30m`, `45s`."""
    unit, size = next(((unit, size) for unit, size in (("d", 86400), ("h", 3600), ("m", 60)) if seconds >= size),
                      ("s", 1))
    value = seconds / size
    return (f"{value:.0f}" if value >= 9.95 else f"{value:.1f}".removesuffix(".0")) + unit


@dataclass(frozen=True)
class IdentityStanding:
    """One identity at one source (`source` None: never used at any source yet). No credentials."""

    identity_id: str
    tier: str
    range: str
    source: str | None
    state: str  # available | leased | resting | retired
    leased_by: str | None = None
    rest_until_s: float | None = None
    score: float = 0.0  # error score: failures add 1, successes take 0.5 off (see identities.health)
    rests: int = 0
    failures: int = 0  # failed answers at the source in the last IDENTITY_FAILURES_WINDOW


# -- the figures ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthThresholds:
    """When a source stops looking healthy. Rates are shares of the window's requests/collections."""

    # Fewer requests than this are too few for a rate: they are judged only when every one went wrong.
    min_requests: int = 5
    # A fifth of answers throttled or blocked: the source is pushing back on us.
    block_rate: float = 0.2
    # Nearly a third failing (5xx, other 4xx, timeouts): the source is down or the requests are wrong.
    failure_rate: float = 0.3
    # Half the successful collections empty: likely a silent change (a layout, an API key) not the leads.
    empty_rate: float = 0.5
    # Under half the monitored leads fresh: recurring crawls are not keeping up.
    fresh_share: float = 0.5


DEFAULT_THRESHOLDS = HealthThresholds()


@dataclass(frozen=True)
class SourceFigures:
    """Everything the fleet knows about one source, in plain numbers (units in the names)."""

    source: str
    health: str
    health_reason: str
    window_s: float
    backlog: int  # queued collections, ready or waiting for their start time
    ready: int
    in_flight: int  # handed to Dagster and not finished
    requests: int
    requests_per_min: float
    collections: int
    collections_failed: int
    records: int
    records_per_min: float
    retry_rate: float | None  # share of requests that were a retry (or a wait after a 429)
    failure_rate: float | None  # share answered transient or permanent (5xx, other 4xx, timeouts)
    block_rate: float | None  # share throttled (429/503) or blocked (401/403/block page)
    empty_rate: float | None  # share of successful collections with no records
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    monitored: int
    fresh: int
    fresh_share: float | None
    monitored_empty: int  # monitored leads whose last success stored nothing
    stalest_age_s: float | None
    identities_available: int
    identities_leased: int
    identities_resting: int
    identities_retired: int
    dead_letters: int
    circuit: str
    spend_today_usd: float
    daily_budget_usd: float
    spend_window_usd: float
    records_per_usd: float | None
    parked: dict[str, int] = field(default_factory=dict)
    evidence_bytes: int = 0  # WARC captures kept for the source
    evidence_usd: float = 0.0  # what keeping them costs (evidence_usd_per_gb)
    # Share of the window's finished collections that were recurring crawls (the rest: fresh leads
    # and backfills); None without any.
    recurring_share: float | None = None
    cadence: Cadence | None = None  # how often its monitored leads are collected again

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# Every numeric figure with its meaning: the `/metrics` gauges and the asset's metadata use this one list.
NUMERIC_FIGURES: dict[str, str] = {
    "backlog": "queued collections (ready or waiting for their start time)",
    "ready": "queued collections ready to go",
    "in_flight": "collections handed to Dagster and not finished",
    "requests_per_min": "requests per minute over the window",
    "records_per_min": "records collected per minute over the window",
    "retry_rate": "share of the window's requests that were retries",
    "failure_rate": "share of the window's requests answered 5xx or other 4xx, timed out or refused",
    "block_rate": "share of the window's requests throttled (429/503) or blocked (401/403, block page)",
    "empty_rate": "share of the window's successful collections that found no records",
    "latency_p50_ms": "median request latency over the window, ms",
    "latency_p95_ms": "95th percentile request latency over the window, ms",
    "fresh_share": "share of monitored leads collected with records within their cadence",
    "monitored": "monitored leads (in an active case, collected by the source before)",
    "stalest_age_s": "age of the stalest monitored lead's last collection with records, s",
    "identities_available": "identities free to lease for the source",
    "identities_leased": "identities leased for the source now",
    "identities_resting": "identities resting at the source (their own rest or their range's)",
    "identities_retired": "identities retired at the source",
    "dead_letters": "collections that gave up",
    "spend_today_usd": "spend since midnight UTC, USD",
    "daily_budget_usd": "daily budget, USD (0: none)",
    "records_per_usd": "records per USD over the window",
    "evidence_bytes": "bytes of WARC captures kept for the source",
    "evidence_usd": "what keeping the source's captures costs, USD (evidence_usd_per_gb)",
    "recurring_share": "share of the window's finished collections that were recurring crawls",
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q` percentile (0 < q <= 1) of `values`, or None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def figures_for(
    spec: SourceSpec,
    *,
    now: datetime,
    window_s: float,
    requests: Sequence[RequestRow] = (),
    collections: Sequence[CollectionRow] = (),
    freshness: Freshness = Freshness(),
    identities: Mapping[str, int] | None = None,
    depth: Mapping[str, int] | None = None,
    dead_letters: int = 0,
    circuit: str = "closed",
    spend_today_usd: float = 0.0,
    spend_window_usd: float = 0.0,
    parked: Mapping[str, int] | None = None,
    thresholds: HealthThresholds = DEFAULT_THRESHOLDS,
) -> SourceFigures:
    """One source's figures from its rows (the caller passes only this source's). `identities`
    counts its identities by state; `depth` is its `queue_depths` entry."""
    identities = identities or {}
    depth = depth or {}
    minutes = window_s / 60
    outcomes = Counter(row.outcome for row in requests)
    by_outcome = Counter(row.outcome for row in collections)
    succeeded = by_outcome["ok"] + by_outcome["empty"]
    records = sum(row.records for row in collections if row.outcome == "ok")
    latencies = [row.latency_ms for row in requests]
    base = SourceFigures(
        source=spec.name,
        health="",
        health_reason="",
        window_s=window_s,
        backlog=depth.get("ready", 0) + depth.get("waiting", 0),
        ready=depth.get("ready", 0),
        in_flight=depth.get("dispatched", 0),
        requests=len(requests),
        requests_per_min=len(requests) / minutes,
        collections=len(collections),
        collections_failed=by_outcome["failed"],
        records=records,
        records_per_min=records / minutes,
        retry_rate=_share(sum(1 for row in requests if row.attempt > 1), len(requests)),
        failure_rate=_share(sum(outcomes[o] for o in _FAILED), len(requests)),
        block_rate=_share(sum(outcomes[o] for o in _BLOCKED), len(requests)),
        empty_rate=_share(by_outcome["empty"], succeeded),
        latency_p50_ms=percentile(latencies, 0.5),
        latency_p95_ms=percentile(latencies, 0.95),
        monitored=freshness.monitored,
        fresh=freshness.fresh,
        fresh_share=_share(freshness.fresh, freshness.monitored),
        monitored_empty=freshness.empty,
        stalest_age_s=(now - freshness.stalest_since).total_seconds() if freshness.stalest_since else None,
        identities_available=identities.get("available", 0),
        identities_leased=identities.get("leased", 0),
        identities_resting=identities.get("resting", 0),
        identities_retired=identities.get("retired", 0),
        dead_letters=dead_letters,
        circuit=circuit,
        spend_today_usd=spend_today_usd,
        daily_budget_usd=spec.daily_budget_usd,
        spend_window_usd=spend_window_usd,
        records_per_usd=records_per_usd(records, spend_window_usd),
        parked=dict(parked or {}),
    )
    health, reason = health_of(base, thresholds)
    return replace(base, health=health, health_reason=reason)


def _too_much(count: int, total: int, limit: float, thresholds: HealthThresholds) -> bool:
    """A rate over its limit on enough requests, or every one of too few requests gone wrong."""
    if total >= thresholds.min_requests:
        return count / total >= limit
    return 0 < total == count


def health_of(f: SourceFigures, thresholds: HealthThresholds = DEFAULT_THRESHOLDS) -> tuple[str, str]:
    """The verdict on a source and why, worst first, so an empty or blocked source never looks ok:

    blocked (pushed back, or no identity left) > failing (circuit, failures) > empty (answers with
    nothing in them) > over_budget > stalled (work ready, nothing sent) > stale (monitored leads
    behind their cadence) > idle (nothing in the window) > ok.
    """
    pushed_back = round((f.block_rate or 0) * f.requests)
    failed = round((f.failure_rate or 0) * f.requests)
    pool = f.identities_available + f.identities_leased + f.identities_resting + f.identities_retired
    if _too_much(pushed_back, f.requests, thresholds.block_rate, thresholds):
        return "blocked", f"{pushed_back} of {f.requests} requests throttled or blocked"
    if pool and not (f.identities_available or f.identities_leased):
        return "blocked", f"no identity left: {f.identities_resting} resting, {f.identities_retired} retired"
    if f.circuit != "closed":
        return "failing", f"circuit {f.circuit}"
    if _too_much(failed, f.requests, thresholds.failure_rate, thresholds):
        return "failing", f"{failed} of {f.requests} requests failed"
    succeeded = f.collections - f.collections_failed
    if succeeded and (f.empty_rate or 0) >= thresholds.empty_rate:
        return "empty", f"{round((f.empty_rate or 0) * succeeded)} of {succeeded} collections found no records"
    if not succeeded and f.monitored and f.monitored_empty / f.monitored >= thresholds.empty_rate:
        return "empty", f"{f.monitored_empty} of {f.monitored} monitored leads stored no records"
    if f.daily_budget_usd > 0 and f.spend_today_usd >= f.daily_budget_usd:
        return "over_budget", f"spent {f.spend_today_usd:.2f} of {f.daily_budget_usd:.2f} USD today"
    if f.ready and not f.requests and not f.collections:
        return "stalled", f"{f.ready} collections ready, nothing sent in {f.window_s / 60:g} min"
    if f.fresh_share is not None and f.fresh_share < thresholds.fresh_share:
        return "stale", f"{f.fresh} of {f.monitored} monitored leads fresh"
    if not f.requests and not f.collections:
        return "idle", f"nothing sent in {f.window_s / 60:g} min"
    return "ok", ""


def identity_standings(
    *,
    identities: Sequence[Mapping[Any, Any]],
    leases: Sequence[Mapping[Any, Any]],
    health: Sequence[Mapping[Any, Any]],
    range_rests: Sequence[Mapping[Any, Any]],
    failures: Mapping[tuple[str, str], int] | None = None,
    now_s: float,
) -> list[IdentityStanding]:
    """Each active identity's standing at every source it has a lease slot or health at (or one row,
    `source` None, if none). Worst first: retired > resting (its own rest or its range's) > leased >
    available. Rows are the registry's, lease slots', health's and range rests' columns."""
    failures = failures or {}
    slots = {(row["identity_id"], row["source"]): row for row in leases}
    standing = {(row["identity_id"], row["source"]): row for row in health}
    range_until = {(row["range"], row["source"]): float(row["rest_until_s"]) for row in range_rests}
    out: list[IdentityStanding] = []
    for ident in identities:
        if not ident.get("active", True):
            continue
        identity_id, range_name = ident["identity_id"], ident["range"]
        sources = sorted({src for (i, src) in (*slots, *standing) if i == identity_id})
        if not sources:
            out.append(IdentityStanding(identity_id, ident["tier"], range_name, None, "available"))
            continue
        for source in sources:
            slot, h = slots.get((identity_id, source)), standing.get((identity_id, source))
            rest_until = h.get("rest_until_s") if h else None
            range_rest = range_until.get((range_name, source))
            leased = slot is not None and not slot["released"] and slot["expires_at_s"] > now_s
            if h is not None and h["state"] == "retired":
                state = "retired"
            elif h is not None and h["state"] == "resting" and rest_until is not None and rest_until > now_s:
                state = "resting"
            elif range_rest is not None and range_rest > now_s:
                state, rest_until = "resting", range_rest
            elif leased:
                state = "leased"
            else:
                state = "available"
            out.append(IdentityStanding(
                identity_id, ident["tier"], range_name, source, state,
                leased_by=slot["holder"] if leased and slot is not None else None,
                rest_until_s=rest_until if state == "resting" else None,
                score=h["score"] if h else 0.0,
                rests=h["rests"] if h else 0,
                failures=failures.get((identity_id, source), 0),
            ))
    return out


def identity_counts(standings: Iterable[IdentityStanding], sources: Sequence[str],
                    *, pool_size: int) -> dict[str, dict[str, int]]:
    """Per source: identities by state. An identity never seen at a source is available there."""
    counts = {source: dict.fromkeys(IDENTITY_STATES, 0) for source in sources}
    seen: dict[str, int] = defaultdict(int)
    for row in standings:
        if row.source in counts:
            counts[row.source][row.state] += 1
            seen[row.source] += 1
    for source in sources:
        counts[source]["available"] += max(0, pool_size - seen[source])
    return counts


# -- reading the store ----------------------------------------------------------------------------


def read_identity_standings(store: StateStore, *, now: datetime | None = None,
                            with_failures: bool = True) -> list[IdentityStanding]:
    """Every active identity's standing per source, from the registry, leases and health; with
    `with_failures`, its failed answers there in the last IDENTITY_FAILURES_WINDOW (a scan of the
    fetch log that the fleet figures do without)."""
    now = now or utcnow()
    i, lease, h, r, fl = s.identities, s.identity_leases, s.identity_health, s.range_rests, s.fetch_log
    failing = (select(fl.c.identity_id, fl.c.source, func.count())
               .where(fl.c.at >= now - IDENTITY_FAILURES_WINDOW, fl.c.outcome != Outcome.OK.value)
               .group_by(fl.c.identity_id, fl.c.source))
    with store.engine.begin() as conn:
        identities = conn.execute(select(i.c.identity_id, i.c.tier, i.c.range, i.c.active)
                                  .order_by(i.c.tier_rank, i.c.identity_id)).mappings().all()
        leases = conn.execute(select(lease.c.identity_id, lease.c.source, lease.c.holder, lease.c.released,
                                     lease.c.expires_at_s)).mappings().all()
        health = conn.execute(select(h.c.identity_id, h.c.source, h.c.state, h.c.score, h.c.rests,
                                     h.c.rest_until_s)).mappings().all()
        rests = conn.execute(select(r.c.range, r.c.source, r.c.rest_until_s)).mappings().all()
        failures = ({(identity, source): count for identity, source, count in conn.execute(failing)}
                    if with_failures else {})
    return identity_standings(identities=identities, leases=leases, health=health, range_rests=rests,
                              failures=failures, now_s=now.timestamp())


def fleet_figures(
    store: StateStore,
    catalog: SourceCatalog,
    *,
    now: datetime | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    circuits: Mapping[str, str] | None = None,
    thresholds: HealthThresholds = DEFAULT_THRESHOLDS,
    data_dir: Path | None = None,
) -> list[SourceFigures]:
    """Every configured source's figures now, in catalog order. `circuits` maps a source to its
    circuit state (the caller reads them from `pacing.Circuits`; absent: closed). With `data_dir`,
    the captures kept under it are counted (bytes and their storage cost)."""
    now = now or utcnow()
    since = now - timedelta(seconds=window_s)
    fl, c, q, dl = s.fetch_log, s.collections, s.collection_queue, s.dead_letters
    with store.engine.begin() as conn:
        requests = [RequestRow(*row) for row in conn.execute(
            select(fl.c.source, fl.c.outcome, fl.c.attempt, fl.c.latency_ms, fl.c.identity_id, fl.c.bytes)
            .where(fl.c.at >= since))]
        collections = [CollectionRow(*row) for row in conn.execute(
            select(c.c.source, c.c.outcome, c.c.records).where(c.c.last_attempt_at >= since))]
        freshness = {spec.name: _freshness(conn, spec, now=now) for spec in catalog.sources}
        learned = {spec.name: _learned_leads(conn, spec) for spec in catalog.sources if not spec.recrawl.is_fixed}
        letters: dict[str, int] = dict(conn.execute(select(dl.c.source, func.count()).group_by(dl.c.source)).all())
        parked_rows = conn.execute(
            select(q.c.source, q.c.park_reason, func.count())
            .where(q.c.state == "queued", q.c.outcome == "parked").group_by(q.c.source, q.c.park_reason)).all()
        pool_size = conn.execute(select(func.count()).where(s.identities.c.active)).scalar() or 0
        # The window's finished rows by their finish time (ix_queue_finished_at), counted here: grouped
        # in SQL, SQLite walks the source index over every row the queue ever held instead.
        finished: Counter[str] = Counter()
        of_recurring: Counter[str] = Counter()
        for source, priority_class in conn.execute(
                select(q.c.source, q.c.priority_class).where(q.c.finished_at >= since, q.c.state == "done")):
            finished[source] += 1
            of_recurring[source] += priority_class == "recurring"
    recurring = {source: of_recurring[source] / total for source, total in finished.items()}
    cadences = {spec.name: Cadence.fixed(spec) for spec in catalog.sources if spec.recrawl.is_fixed}
    for spec in catalog.sources:
        if spec.name in learned:
            cadences[spec.name], fresh = _learned_cadence(store, spec, learned[spec.name], now=now)
            freshness[spec.name] = replace(freshness[spec.name], fresh=fresh)
    depths = store.queue_depths(now=now)
    standings = read_identity_standings(store, now=now, with_failures=False)
    counts = identity_counts(standings, catalog.names, pool_size=pool_size)
    spent_today = spend_today(store, catalog, now=now)
    window_usage: Counter[tuple[str, str]] = Counter()
    window_bytes: Counter[tuple[str, str]] = Counter()
    for row in requests:
        window_usage[(row.source, row.identity_id)] += 1
        window_bytes[(row.source, row.identity_id)] += row.bytes
    spent_window = spend_by_source([Usage(src, ident, n, window_bytes[(src, ident)])
                                    for (src, ident), n in window_usage.items()], catalog, identity_prices(store))
    parked: dict[str, dict[str, int]] = defaultdict(dict)
    for source, reason, count in parked_rows:
        parked[source][reason or "unknown"] = count
    by_source = _group(requests), _group(collections)
    kept = evidence_bytes_by_source(data_dir) if data_dir is not None else {}
    return [
        replace(figures_for(
            spec, now=now, window_s=window_s,
            requests=by_source[0].get(spec.name, []),
            collections=by_source[1].get(spec.name, []),
            freshness=freshness[spec.name],
            identities=counts[spec.name],
            depth=depths.get(spec.name),
            dead_letters=letters.get(spec.name, 0),
            circuit=(circuits or {}).get(spec.name, "closed"),
            spend_today_usd=spent_today.get(spec.name, 0.0),
            spend_window_usd=spent_window.get(spec.name, 0.0),
            parked=parked.get(spec.name),
            thresholds=thresholds,
        ), evidence_bytes=kept.get(spec.name, 0), evidence_usd=evidence_cost_usd(spec, kept.get(spec.name, 0)),
           recurring_share=recurring.get(spec.name), cadence=cadences[spec.name])
        for spec in catalog.sources
    ]


def _freshness(conn: Connection, spec: SourceSpec, *, now: datetime) -> Freshness:
    """Monitored leads of `spec` (in an active case, collected by it before) summed up in SQL; fresh
    within `recrawl_every_s`, which a learned source's figures count again lead by lead
    (`_learned_cadence`)."""
    c = s.collections
    active = _active_leads()
    with_records = and_(c.c.records > 0, c.c.last_success_at.is_not(None))
    cutoff = now - timedelta(seconds=spec.recrawl_every_s)
    since = case((with_records, c.c.last_success_at), else_=s.leads.c.created_at)
    query = (
        select(func.count(),
               func.coalesce(func.sum(case((and_(with_records, c.c.last_success_at >= cutoff), 1), else_=0)), 0),
               func.coalesce(func.sum(case((and_(c.c.records == 0, c.c.last_success_at.is_not(None)), 1),
                                           else_=0)), 0),
               type_coerce(func.min(since), s.UTCDateTime))
        .select_from(c.join(s.leads, s.leads.c.lead_id == c.c.lead_id))
        .where(c.c.source == spec.name, c.c.lead_id.in_(active))
    )
    monitored, fresh, empty, stalest = conn.execute(query).one()
    return Freshness(monitored, int(fresh), int(empty), stalest)


def _active_leads() -> Any:
    """The leads of active cases, as a subquery."""
    return (select(s.case_leads.c.lead_id).join(s.cases, s.cases.c.case_id == s.case_leads.c.case_id)
            .where(s.cases.c.status == "active"))


def _learned_leads(conn: Connection, spec: SourceSpec) -> list[Row[Any]]:
    """A learned source's monitored leads (as `_freshness` counts them), one row each, in one query:
    its last success when that one had records (`fresh_at`, else None); whether its plan weighs it
    (`planned`: of a kind the source takes, not a dead letter there, as `StateStore.cadence_leads`
    reads them); its rate of change as kept (`rate_per_s` for a prior of `prior_s`, else its
    `visits`); and the source's stored plan (`scale`, `short`, `planned_at`: None when not planned
    yet), the same on every row."""
    c, lc, cp, dl = s.collections, s.lead_visits, s.cadence_plans, s.dead_letters
    with_records = and_(c.c.records > 0, c.c.last_success_at.is_not(None))
    dead = select(dl.c.lead_id).where(dl.c.source == spec.name)
    planned = and_(s.leads.c.kind.in_(list(spec.lead_kinds)), c.c.lead_id.not_in(dead))
    query = (
        select(c.c.lead_id, type_coerce(case((with_records, c.c.last_success_at)), s.UTCDateTime).label("fresh_at"),
               planned.label("planned"), lc.c.visits, lc.c.rate_per_s, lc.c.prior_s, cp.c.scale, cp.c.short,
               cp.c.planned_at)
        .select_from(c.join(s.leads, s.leads.c.lead_id == c.c.lead_id)
                     .outerjoin(lc, and_(lc.c.source == c.c.source, lc.c.lead_id == c.c.lead_id))
                     .outerjoin(cp, cp.c.source == c.c.source))
        .where(c.c.source == spec.name, c.c.lead_id.in_(_active_leads()))
    )
    return list(conn.execute(query))


def _learned_cadence(store: StateStore, spec: SourceSpec, leads: Sequence[Row[Any]], *,
                     now: datetime) -> tuple[Cadence, int]:
    """A learned source's cadence, and how many of its monitored `leads` (`_learned_leads`) are fresh.

    Each lead's planned interval is worked out under the plan the recurring planner last stored
    (`cadence.planned_interval_s`, with the lead's own rate), as a lead's next visit is; only a source
    not planned yet is planned now (`degradation.lead_intervals_s`). A lead is fresh by the
    `fresh_within_cadence` check's rule (`degradation.freshness_verdict`): its last collection with
    records within its own interval plus its grace, or within `recrawl.max` when the plan leaves it out."""
    stored = leads[0] if leads and leads[0].planned_at is not None else None
    if stored is not None:
        plan = stored_plan(stored)
        intervals = {row.lead_id: planned_interval_s(spec, rate_per_s=_rate_per_s(spec, row), open_case=True,
                                                     plan=plan) for row in leads if row.planned}
    else:
        intervals = (lead_intervals_s(store, spec, now=now) or {}) if leads else {}
    planned = [intervals[row.lead_id] for row in leads if intervals.get(row.lead_id, math.inf) != math.inf]
    # Not planned yet: short when its budget leaves every lead at its max (what a short plan does).
    short = stored.short if stored is not None else bool(planned) and min(planned) >= spec.recrawl.max_s
    cadence = Cadence("learned", statistics.median(planned) if planned else None, spec.recrawl.min_s,
                      spec.recrawl.max_s, budget_short=bool(short),
                      planned_at=stored.planned_at if stored is not None else None)
    verdict = freshness_verdict([(row.lead_id, row.fresh_at) for row in leads], cadence_s=spec.recrawl_every_s,
                                now=now, intervals_s=intervals, window_s=spec.recrawl.min_s)
    stale = verdict.details["stale_leads"]
    assert isinstance(stale, int)
    return cadence, len(leads) - stale


def _rate_per_s(spec: SourceSpec, row: Row[Any]) -> float:
    """A lead's rate of change as its source's planner reads it: the one kept for the source's prior,
    else estimated from its visits (a lead never visited: the prior's)."""
    if row.rate_per_s is not None and row.prior_s == spec.recrawl.prior_s:
        return float(row.rate_per_s)
    return change_rate(decode_visits(row.visits or ""), prior_rate_per_s(spec))


def _group(rows: Iterable[Any]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        grouped[row.source].append(row)
    return grouped


# -- pacing: what the rate lanes learned -----------------------------------------------------------


@dataclass(frozen=True)
class LaneStanding:
    """One rate lane now, in requests per second: the source's shared lane (`identity_id` None) or
    one identity's lane at the source.

    `in_use_per_s` is the configured rate times the lane's AIMD factor. `ceiling_per_s` is the rate
    the source last throttled the lane at, the learned ceiling the lane settles just under; None
    (and no age) when it never did, so the configured rate is the only limit known. A Retry-After
    still ahead holds the lane until `floor_until_s` (epoch s) whatever its rate."""

    source: str
    identity_id: str | None
    configured_per_s: float
    in_use_per_s: float
    ceiling_per_s: float | None = None
    ceiling_age_s: float | None = None
    floor_until_s: float | None = None


def standings_of_lanes(states: Iterable[LaneState], catalog: SourceCatalog, *, now_s: float) -> list[LaneStanding]:
    """Each lane of `states` that belongs to a configured source, in catalog order, the source's lane
    before its identities' (by id). A lane of a source no longer configured is left out: its
    configured rate is gone, and no request uses the lane any more."""
    by_name = {state.lane: state for state in states}
    out: list[LaneStanding] = []
    for spec in catalog.sources:
        own = by_name.get(source_lane(spec).name)
        if own is not None:
            out.append(_standing(spec.name, None, spec.rate.source_per_s, own, now_s=now_s))
        prefix = identity_lane_name(spec.name, "")
        identities = sorted(((name.removeprefix(prefix), state) for name, state in by_name.items()
                             if name.startswith(prefix) and name != prefix), key=lambda item: item[0])
        out += [_standing(spec.name, identity, spec.rate.identity_per_s, state, now_s=now_s)
                for identity, state in identities]
    return out


def _standing(source: str, identity_id: str | None, configured_per_s: float, state: LaneState, *,
              now_s: float) -> LaneStanding:
    cut = state.last_cut_s != NEVER_CUT_S
    return LaneStanding(
        source=source, identity_id=identity_id, configured_per_s=configured_per_s,
        in_use_per_s=configured_per_s * state.rate_factor,
        ceiling_per_s=configured_per_s * state.ceiling_factor if cut else None,
        # Another process's clock may run a little ahead: a cut is never in the future.
        ceiling_age_s=max(0.0, now_s - state.last_cut_s) if cut else None,
        floor_until_s=state.not_before_s if state.not_before_s > now_s else None,
    )


def lane_standings(store: StateStore, catalog: SourceCatalog, now_s: float | None = None) -> list[LaneStanding]:
    """Every rate lane the store holds a row for, as `standings_of_lanes` gives them (now: the clock).
    A lane gets its row at its first request (or throttle): a source or identity that never sent has
    none, and is left out."""
    # The sampler draws slot lengths; reading the lanes draws none.
    states = RateLanes(store, sampler=GapSampler(random.Random())).all_states()
    return standings_of_lanes(states, catalog, now_s=time.time() if now_s is None else now_s)


# -- cumulative totals (the `/metrics` counters) ----------------------------------------------------

# Upper bounds of the request latency histogram, ms: 0.05 s to 30 s (three times the default
# request timeout); the +Inf bucket above them holds every request.
LATENCY_BUCKETS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000)
# A target the fetcher refused (the SSRF guard, a redirect it cannot check) is logged as permanent,
# with no status (nothing was asked) and an error that starts with this.
REFUSED_ERROR = "refused "
# The queue's states as `FleetTotals.queue` counts them (waiting: queued, its not_before ahead).
QUEUE_STATES = ("ready", "waiting", "dispatched")
# How long after it was logged (or queued) a row is taken as committed, whatever transaction was
# still open when it was written: only then is it folded into `TotalsReader`'s running totals.
SETTLE = timedelta(minutes=10)


@dataclass(frozen=True)
class RequestTotals:
    """Requests of one source with one outcome in the fetch log. Sums are integers (latency in whole
    microseconds), so a total read again after more rows were added is never smaller, whatever the
    order the database added them up in."""

    requests: int = 0
    retries: int = 0  # attempt > 1
    refusals: int = 0  # targets refused, never asked (see REFUSED_ERROR)
    bytes: int = 0  # of answer
    latency_us: int = 0
    # Cumulative, one per LATENCY_BUCKETS_MS bound: requests that took at most that long.
    within: tuple[int, ...] = (0,) * len(LATENCY_BUCKETS_MS)

    def __add__(self, other: RequestTotals) -> RequestTotals:
        return RequestTotals(self.requests + other.requests, self.retries + other.retries,
                             self.refusals + other.refusals, self.bytes + other.bytes,
                             self.latency_us + other.latency_us,
                             tuple(a + b for a, b in zip(self.within, other.within, strict=True)))


@dataclass(frozen=True)
class FleetTotals:
    """What `/metrics` reads from the store besides `fleet_figures`.

    `requests` and `collections` are cumulative and only grow while the store does: the fetch log is
    append-only, and a queue row once done is never changed again. `collections` counts the
    collections dispatched from the queue that finished: its done rows that were dispatched (a
    finished collection also closes the queued duplicates it satisfied, never dispatched: those are
    not counted again). A collection launched by hand outside the queue is not among them. The
    `collections` table cannot count them: it keeps only each (source, lead)'s latest attempt."""

    requests: dict[tuple[str, str], RequestTotals]  # (source, outcome) -> every attempt logged
    collections: dict[tuple[str, str], int]  # (source, outcome: ok | empty | failed) -> finished
    queue: dict[tuple[str, str, str], int]  # (source, priority_class, QUEUE_STATES) -> rows now
    newest_success: dict[str, datetime]  # source -> its newest successful collection (ok or empty)
    records_held: dict[str, int]  # source -> records its leads' latest successful collections stored


class TotalsReader:
    """Reads `FleetTotals`, keeping in memory the part of them that can no longer change, so a
    reader that reads again and again (the `/metrics` collector, on every scrape) scans only what
    was written since rather than the store's whole history (a million fetch-log rows take seconds).

    Kept: the fetch log's totals up to a row id, and the dispatched-and-done queue rows' counts up
    to a row id below which every row is done. Rows are folded in once they are SETTLE old (by
    `at`, by `enqueued_at`): a row with a lower id still uncommitted then (Postgres hands ids out at
    insert, not at commit) would be missed, and no writer holds a one-row insert open that long
    (with clocks within SETTLE of each other). A store that starts over (its highest id below the
    kept one) is read afresh. Safe to share between threads."""

    def __init__(self, store: StateStore, *, settle: timedelta = SETTLE) -> None:
        self._store = store
        self._settle = settle
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._log_through = 0  # fetch-log rows with id <= this are in _requests
        self._requests: dict[tuple[str, str], RequestTotals] = {}
        self._queue_through = 0  # queue rows with id <= this are done, and counted in _collections
        self._collections: Counter[tuple[str, str]] = Counter()

    def read(self, *, now: datetime | None = None) -> FleetTotals:
        now = now or utcnow()
        fl, q = s.fetch_log, s.collection_queue
        with self._lock, self._store.reading() as conn:
            top_log = conn.execute(select(func.max(fl.c.id))).scalar() or 0
            top_queue = conn.execute(select(func.max(q.c.id))).scalar() or 0
            if top_log < self._log_through or top_queue < self._queue_through:
                self._reset()
            self._fold(conn, now=now, top_log=top_log, top_queue=top_queue)
            requests = dict(self._requests)
            for key, more in _request_totals(conn, after=self._log_through).items():
                requests[key] = requests.get(key, RequestTotals()) + more
            collections = self._collections + _finished(conn, after=self._queue_through)
            return FleetTotals(requests=requests, collections=dict(collections), **_states_now(conn, now=now))

    def _fold(self, conn: Connection, *, now: datetime, top_log: int, top_queue: int) -> None:
        """Fold the rows that can no longer change into the kept totals."""
        fl, q = s.fetch_log, s.collection_queue
        cutoff = now - self._settle
        recent = conn.execute(select(func.min(fl.c.id)).where(fl.c.id > self._log_through, fl.c.at >= cutoff)).scalar()
        through = top_log if recent is None else recent - 1
        if through > self._log_through:
            for key, more in _request_totals(conn, after=self._log_through, through=through).items():
                self._requests[key] = self._requests.get(key, RequestTotals()) + more
            self._log_through = through
        open_row = conn.execute(select(func.min(q.c.id)).where(q.c.state != "done")).scalar()
        recent = conn.execute(select(func.min(q.c.id)).where(q.c.id > self._queue_through,
                                                            q.c.enqueued_at >= cutoff)).scalar()
        through = min((row - 1 for row in (open_row, recent) if row is not None), default=top_queue)
        if through > self._queue_through:
            self._collections += _finished(conn, after=self._queue_through, through=through)
            self._queue_through = through


def read_totals(store: StateStore, *, now: datetime | None = None) -> FleetTotals:
    """`FleetTotals` read afresh: the whole fetch log and queue scanned (see `TotalsReader`)."""
    return TotalsReader(store).read(now=now)


def _request_totals(conn: Connection, *, after: int, through: int | None = None
                    ) -> dict[tuple[str, str], RequestTotals]:
    """The fetch log's rows with `after` < id <= `through` (None: the last), summed per source and outcome."""
    fl = s.fetch_log
    refused = and_(fl.c.outcome == Outcome.PERMANENT.value, fl.c.status.is_(None),
                   fl.c.error.like(f"{REFUSED_ERROR}%"))

    def total(expression: Any) -> Any:
        return func.coalesce(func.sum(expression), 0)

    query = (
        select(fl.c.source, fl.c.outcome, func.count(), total(case((fl.c.attempt > 1, 1), else_=0)),
               total(case((refused, 1), else_=0)), total(fl.c.bytes),
               total(cast(func.round(fl.c.latency_ms * 1000), BigInteger)),
               *(total(case((fl.c.latency_ms <= bound, 1), else_=0)) for bound in LATENCY_BUCKETS_MS))
        .where(fl.c.id > after)
        # Outcome first: grouped by source first, SQLite walks the whole (source, at) index instead of
        # the id range (seconds on a million rows, for the few written since the last read).
        .group_by(fl.c.outcome, fl.c.source)
    )
    if through is not None:
        query = query.where(fl.c.id <= through)
    return {(source, outcome): RequestTotals(int(n), int(retries), int(refusals), int(size), int(us),
                                             tuple(int(w) for w in within))
            for source, outcome, n, retries, refusals, size, us, *within in conn.execute(query)}


def _finished(conn: Connection, *, after: int, through: int | None = None) -> Counter[tuple[str, str]]:
    """Queue rows with `after` < id <= `through` (None: the last) that were dispatched and are done,
    per source and outcome."""
    q = s.collection_queue
    query = (select(q.c.source, q.c.outcome, func.count())
             .where(q.c.id > after, q.c.state == "done", q.c.dispatched_at.is_not(None))
             .group_by(q.c.outcome, q.c.source))  # outcome first, as in `_request_totals`
    if through is not None:
        query = query.where(q.c.id <= through)
    return Counter({(source, outcome or "unknown"): int(n) for source, outcome, n in conn.execute(query)})


def _states_now(conn: Connection, *, now: datetime) -> dict[str, Any]:
    """The queue by priority class and state, and each source's newest success and records held."""
    q, c = s.collection_queue, s.collections
    waiting = (q.c.state == "queued") & (q.c.not_before > now)
    depths: Counter[tuple[str, str, str]] = Counter()
    for source, priority_class, state, is_waiting, count in conn.execute(
            select(q.c.source, q.c.priority_class, q.c.state, waiting, func.count())
            .where(q.c.state != "done").group_by(q.c.source, q.c.priority_class, q.c.state, waiting)):
        depths[(source, priority_class, "dispatched" if state == "dispatched" else
                ("waiting" if is_waiting else "ready"))] += count
    latest = conn.execute(select(c.c.source, func.max(c.c.last_success_at), func.coalesce(func.sum(c.c.records), 0))
                          .group_by(c.c.source)).all()
    return {"queue": dict(depths),
            "newest_success": {source: newest for source, newest, _ in latest if newest is not None},
            "records_held": {source: int(held) for source, _, held in latest}}
