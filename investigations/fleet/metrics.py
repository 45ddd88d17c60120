"""The fleet in Prometheus' text format (`GET /metrics` on the intake).

A custom collector reads the state store on every scrape rather than counting in module-global
counters: each process of the fleet writes the store, not this one, so only the store knows the
whole fleet's figures, and a restarted intake loses nothing. What it serves follows Prometheus'
conventions, so rates, ratios and quantiles are Prometheus' to compute, over any range:

- counters (`_total`), cumulative since the store began: requests by outcome, retries, refusals and
  answer bytes (the fetch log, which is append-only); finished collections by outcome (the queue's
  dispatched rows once done, never changed again; see `stats.FleetTotals`); records found by
  finished collections (the state store's running total per source, `source_totals`);
- a histogram of request latency in seconds (the fetch log's `latency_ms`);
- gauges for states only: the queue, identities, circuits, dead letters, freshness, records held,
  spend today, the budget, evidence kept, each source's health verdict, each rate lane's pacing (its
  configured rate, the rate it uses now and the ceiling it learned), and the registered leads by
  whether they are Dagster partitions now.

The collector keeps one `stats.TotalsReader`, so a scrape reads only the rows written since the
ones it already summed (the first scrape after a start reads the whole fetch log once).

The window figures of the old exposition (`_per_min`, `_rate`, `_p50_ms`, `_p95_ms` gauges) are gone:
`rate(investigations_requests_total[5m])` and `histogram_quantile(0.95, ...)` over
`investigations_request_duration_seconds_bucket` compute them, over any range.

Nothing here carries a URL, an error text, a credential or a proxy: labels are source names, fixed
vocabularies (outcomes, states, priority classes) and, on the pacing gauges only, the identity ids of
the lanes (the names the identities file gives them, as the fetch log and run metadata do;
`identity=""` is the source's own lane).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from investigations.collection.events import Outcome
from investigations.fleet.stats import (
    DEFAULT_WINDOW_S,
    HEALTH_STATES,
    IDENTITY_STATES,
    LATENCY_BUCKETS_MS,
    QUEUE_STATES,
    FleetTotals,
    LaneStanding,
    RequestTotals,
    SourceFigures,
    TotalsReader,
    fleet_figures,
    lane_standings,
)
from investigations.pacing import Circuits
from investigations.pacing.circuit import CircuitStateName
from investigations.scheduling.priority import PriorityClass
from investigations.sources.specs import SourceCatalog
from investigations.store import StateStore, utcnow

PREFIX = "investigations_"
# The histogram's bucket bounds in seconds, as Prometheus' `le` label gives them.
LATENCY_BUCKETS_S = tuple(bound / 1000 for bound in LATENCY_BUCKETS_MS)
CIRCUIT_STATES: tuple[str, ...] = get_args(CircuitStateName)
COLLECTION_OUTCOMES = ("ok", "empty", "failed")


class FleetCollector(Collector):
    """Every family of `/metrics`, built from the store when scraped (see the module docstring)."""

    def __init__(self, store: StateStore, catalog: SourceCatalog, *, window_s: float = DEFAULT_WINDOW_S,
                 data_dir: Path | None = None) -> None:
        self._store = store
        self._catalog = catalog
        self._window_s = window_s  # of the health verdict
        self._data_dir = data_dir
        self._totals = TotalsReader(store)  # keeps what can no longer change between scrapes

    def collect(self) -> Iterator[Metric]:
        now = utcnow()
        totals = self._totals.read(now=now)
        circuits = {source: state.state for source, state in Circuits(self._store).all_states().items()}
        figures = fleet_figures(self._store, self._catalog, now=now, window_s=self._window_s, circuits=circuits,
                                data_dir=self._data_dir)
        # Counters keep the sources the store has history of, even one no longer configured.
        records = self._store.records_totals()
        sources = _ordered(self._catalog.names, (source for source, _ in totals.requests),
                           (source for source, _ in totals.collections), records)
        yield from _request_counters(totals, sources)
        yield _collection_counter(totals, sources)
        yield _records_counter(records, sources)
        yield _latency_histogram(totals, sources)
        yield from _state_gauges(figures, totals, now=now)
        yield from _pacing_gauges(lane_standings(self._store, self._catalog, now.timestamp()))
        yield _lead_partitions(self._store.lead_partition_counts())


def _ordered(first: Sequence[str], *more: Iterable[str]) -> list[str]:
    """`first` in its order, then any other name of `more`, sorted."""
    seen = set(first)
    return list(first) + sorted({name for names in more for name in names} - seen)


def _request_counters(totals: FleetTotals, sources: Sequence[str]) -> Iterator[Metric]:
    requests = CounterMetricFamily(f"{PREFIX}requests", "requests sent, every attempt, by outcome (fetch log)",
                                   labels=["source", "outcome"])
    retries = CounterMetricFamily(f"{PREFIX}retries", "requests that were a retry or a wait after a 429 (attempt > 1)",
                                  labels=["source"])
    refusals = CounterMetricFamily(f"{PREFIX}refusals",
                                   "requests refused before they were sent (SSRF guard, an uncheckable redirect); "
                                   "also counted under outcome=\"permanent\"", labels=["source"])
    answered = CounterMetricFamily(f"{PREFIX}response_bytes", "bytes of answer received", labels=["source"])
    outcomes = _ordered([o.value for o in Outcome], (outcome for _, outcome in totals.requests))
    per_source = _per_source(totals)
    for source in sources:
        for outcome in outcomes:
            requests.add_metric([source, outcome], totals.requests.get((source, outcome), RequestTotals()).requests)
        retries.add_metric([source], per_source[source].retries)
        refusals.add_metric([source], per_source[source].refusals)
        answered.add_metric([source], per_source[source].bytes)
    yield from (requests, retries, refusals, answered)


def _collection_counter(totals: FleetTotals, sources: Sequence[str]) -> Metric:
    family = CounterMetricFamily(f"{PREFIX}collections",
                                 "collections dispatched from the fleet's queue that finished, by outcome: ok "
                                 "(records found), empty, failed (gave up)",
                                 labels=["source", "outcome"])
    outcomes = _ordered(COLLECTION_OUTCOMES, (outcome for _, outcome in totals.collections))
    for source in sources:
        for outcome in outcomes:
            family.add_metric([source, outcome], totals.collections.get((source, outcome), 0))
    return family


def _records_counter(records: Mapping[str, int], sources: Sequence[str]) -> Metric:
    family = CounterMetricFamily(f"{PREFIX}records",
                                 "records found by finished collections (a lead collected again counts its records "
                                 "again): the state store's running total", labels=["source"])
    for source in sources:
        family.add_metric([source], records.get(source, 0))
    return family


def _latency_histogram(totals: FleetTotals, sources: Sequence[str]) -> Metric:
    family = HistogramMetricFamily(f"{PREFIX}request_duration_seconds",
                                   "request latency, every attempt (fetch log), seconds", labels=["source"])
    per_source = _per_source(totals)
    for source in sources:
        t = per_source[source]
        buckets = [(floatToGoString(bound), float(n)) for bound, n in zip(LATENCY_BUCKETS_S, t.within, strict=True)]
        family.add_metric([source], [*buckets, ("+Inf", float(t.requests))], sum_value=t.latency_us / 1e6)
    return family


def _per_source(totals: FleetTotals) -> defaultdict[str, RequestTotals]:
    summed: defaultdict[str, RequestTotals] = defaultdict(RequestTotals)
    for (source, _), t in totals.requests.items():
        summed[source] += t
    return summed


def _state_gauges(figures: Sequence[SourceFigures], totals: FleetTotals, *, now: datetime) -> Iterator[Metric]:
    yield _queue_depth(figures, totals)
    yield from _source_states(figures, now=now, totals=totals)
    yield from _leads_and_money(figures)


def _queue_depth(figures: Sequence[SourceFigures], totals: FleetTotals) -> Metric:
    family = GaugeMetricFamily(f"{PREFIX}queue_depth",
                               "collections in the fleet's queue now: ready, waiting for their start time, or "
                               "dispatched to Dagster and not finished", labels=["source", "priority_class", "state"])
    sources = _ordered([f.source for f in figures], (source for source, _, _ in totals.queue))
    classes = _ordered([p.value for p in PriorityClass], (cls for _, cls, _ in totals.queue))
    for source in sources:
        for priority_class in classes:
            for state in QUEUE_STATES:
                family.add_metric([source, priority_class, state], totals.queue.get((source, priority_class, state), 0))
    return family


def _source_states(figures: Sequence[SourceFigures], *, now: datetime, totals: FleetTotals) -> Iterator[Metric]:
    health = GaugeMetricFamily(f"{PREFIX}source_health",
                               "the source's health verdict over the last window (1: current, 0: not)",
                               labels=["source", "health"])
    circuit = GaugeMetricFamily(f"{PREFIX}circuit_state", "the source's circuit breaker (1: current state, 0: not)",
                                labels=["source", "state"])
    identities = GaugeMetricFamily(f"{PREFIX}identities",
                                   "identities of the pool by state at the source (a resting range counts as resting)",
                                   labels=["source", "state"])
    letters = GaugeMetricFamily(f"{PREFIX}dead_letters", "collections that gave up and are not collected since",
                                labels=["source"])
    newest = GaugeMetricFamily(f"{PREFIX}newest_collection_age_seconds",
                               "age of the source's newest successful collection (ok or empty), seconds; "
                               "absent when it never collected", labels=["source"])
    held = GaugeMetricFamily(f"{PREFIX}records_held",
                             "records stored now by the latest successful collection of each lead", labels=["source"])
    backlog = GaugeMetricFamily(f"{PREFIX}source_backlog",
                                "queued collections, ready or waiting for their start time (the sum of "
                                "investigations_queue_depth over those states)", labels=["source"])
    for f in figures:
        for state in HEALTH_STATES:
            health.add_metric([f.source, state], 1.0 if f.health == state else 0.0)
        for state in _ordered(CIRCUIT_STATES, [f.circuit]):
            circuit.add_metric([f.source, state], 1.0 if f.circuit == state else 0.0)
        for state in IDENTITY_STATES:
            identities.add_metric([f.source, state], getattr(f, f"identities_{state}"))
        letters.add_metric([f.source], f.dead_letters)
        if (newest_at := totals.newest_success.get(f.source)) is not None:
            newest.add_metric([f.source], max(0.0, (now - newest_at).total_seconds()))
        held.add_metric([f.source], totals.records_held.get(f.source, 0))
        backlog.add_metric([f.source], f.backlog)
    yield from (health, circuit, identities, letters, newest, held, backlog)


def _leads_and_money(figures: Sequence[SourceFigures]) -> Iterator[Metric]:
    monitored = GaugeMetricFamily(
        f"{PREFIX}monitored_leads",
        "leads the source monitors (in an active case, collected by it before) by freshness: fresh (collected with "
        "records within its recrawl_every), empty (its last success stored nothing), stale (the others)",
        labels=["source", "freshness"])
    stalest = GaugeMetricFamily(f"{PREFIX}stalest_monitored_lead_age_seconds",
                                "age of the stalest monitored lead's last collection with records (or, lacking "
                                "one, of its joining the fleet), seconds; absent without monitored leads",
                                labels=["source"])
    spend = GaugeMetricFamily(f"{PREFIX}spend_today_usd", "spend since midnight UTC, USD", labels=["source"])
    budget = GaugeMetricFamily(f"{PREFIX}daily_budget_usd", "the source's daily budget, USD (0: none)",
                               labels=["source"])
    evidence = GaugeMetricFamily(f"{PREFIX}evidence_bytes", "bytes of WARC captures kept for the source",
                                 labels=["source"])
    evidence_usd = GaugeMetricFamily(f"{PREFIX}evidence_usd",
                                     "what keeping the source's captures costs, USD (evidence_usd_per_gb)",
                                     labels=["source"])
    for f in figures:
        stale = f.monitored - f.fresh - f.monitored_empty
        for freshness, count in (("fresh", f.fresh), ("empty", f.monitored_empty), ("stale", stale)):
            monitored.add_metric([f.source, freshness], count)
        if f.stalest_age_s is not None:
            stalest.add_metric([f.source], f.stalest_age_s)
        spend.add_metric([f.source], f.spend_today_usd)
        budget.add_metric([f.source], f.daily_budget_usd)
        evidence.add_metric([f.source], f.evidence_bytes)
        evidence_usd.add_metric([f.source], f.evidence_usd)
    yield from (monitored, stalest, spend, budget, evidence, evidence_usd)


def _pacing_gauges(lanes: Sequence[LaneStanding]) -> Iterator[Metric]:
    """Each rate lane with a row (it sent, or was throttled), of a configured source: `identity` is the
    lane's identity id, "" for the source's own lane (shared by every identity)."""
    labels = ["source", "identity"]
    configured = GaugeMetricFamily(f"{PREFIX}pacing_configured_rate_per_second",
                                   "the lane's rate as sources.yaml configures it, requests per second", labels=labels)
    in_use = GaugeMetricFamily(f"{PREFIX}pacing_rate_per_second",
                               "the rate the lane sends at now: the configured rate times its AIMD factor, requests "
                               "per second", labels=labels)
    ceiling = GaugeMetricFamily(f"{PREFIX}pacing_ceiling_rate_per_second",
                                "the lane's learned ceiling: the rate the source last throttled it at, requests per "
                                "second; absent for a lane never throttled", labels=labels)
    for lane in lanes:
        key = [lane.source, lane.identity_id or ""]
        configured.add_metric(key, lane.configured_per_s)
        in_use.add_metric(key, lane.in_use_per_s)
        if lane.ceiling_per_s is not None:
            ceiling.add_metric(key, lane.ceiling_per_s)
    yield from (configured, in_use, ceiling)


def _lead_partitions(counts: dict[str, int]) -> Metric:
    family = GaugeMetricFamily(f"{PREFIX}leads", "registered leads by whether they are Dagster partitions now "
                               "(active) or retired (no open case holds them; their history is kept)",
                               labels=["partitions"])
    for state in ("active", "retired"):
        family.add_metric([state], counts.get(state, 0))
    return family


def fleet_registry(store: StateStore, catalog: SourceCatalog, *, window_s: float = DEFAULT_WINDOW_S,
                   data_dir: Path | None = None) -> CollectorRegistry:
    """A registry of its own holding only the fleet collector (not the process-global one); it
    never scrapes on registration (`auto_describe=False`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(store, catalog, window_s=window_s, data_dir=data_dir))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in the text exposition format (reads the store: call off the event loop)."""
    return generate_latest(registry)
