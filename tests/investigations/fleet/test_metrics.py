"""`/metrics` follows Prometheus' conventions: counters read from the store that never go down, a
latency histogram, gauges for states only, nothing secret; and the Grafana dashboard reads only
what a scrape serves."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from investigations.adapters import PlannedRequest
from investigations.collection.events import FetchEvent, Outcome
from investigations.collection.fetcher import Fetcher, FetchFailed
from investigations.fleet.metrics import LATENCY_BUCKETS_S, fleet_registry, render
from investigations.fleet.stats import TotalsReader, read_totals
from investigations.identities import IdentityPool, parse_identities
from investigations.intake.leads import normalize_lead
from investigations.pacing import Circuits, GapSampler, RateLanes
from investigations.pacing.lanes import identity_lane, source_lane
from investigations.sources.specs import parse_sources
from investigations.store import StateStore
from investigations.store import schema as s

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
CATALOG = parse_sources("""
sources:
  - name: api
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://api.example/lookup?q={value}"}
    recrawl_every: 1h
    daily_budget_usd: 3
    rate: {source_per_s: 8, identity_per_s: 2}
  - name: quiet
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://quiet.example/lookup?q={value}"}
""")
PASSWORD = "s3cret-proxy-pass-77"
LEAD = normalize_lead("domain", "a.example")
OTHER = normalize_lead("domain", "b.example")

COUNTERS = {
    "investigations_requests": ["outcome", "source"],
    "investigations_retries": ["source"],
    "investigations_refusals": ["source"],
    "investigations_response_bytes": ["source"],
    "investigations_collections": ["outcome", "source"],
    "investigations_records": ["source"],
}
GAUGES = {
    "investigations_queue_depth": ["priority_class", "source", "state"],
    "investigations_source_health": ["health", "source"],
    "investigations_circuit_state": ["source", "state"],
    "investigations_identities": ["source", "state"],
    "investigations_dead_letters": ["source"],
    "investigations_newest_collection_age_seconds": ["source"],
    "investigations_records_held": ["source"],
    "investigations_source_backlog": ["source"],
    "investigations_monitored_leads": ["freshness", "source"],
    "investigations_stalest_monitored_lead_age_seconds": ["source"],
    "investigations_spend_today_usd": ["source"],
    "investigations_daily_budget_usd": ["source"],
    "investigations_evidence_bytes": ["source"],
    "investigations_evidence_usd": ["source"],
    "investigations_pacing_configured_rate_per_second": ["identity", "source"],
    "investigations_pacing_rate_per_second": ["identity", "source"],
    "investigations_pacing_ceiling_rate_per_second": ["identity", "source"],
    "investigations_leads": ["partitions"],
}
HISTOGRAMS = {"investigations_request_duration_seconds": ["le", "source"]}


def families(registry) -> dict:
    return {family.name: family for family in text_string_to_metric_families(render(registry).decode())}


def samples(registry) -> dict[tuple[str, tuple], float]:
    """Every sample by (sample name, sorted labels)."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in families(registry).values() for sample in family.samples}


def fetched(store: StateStore, source: str, outcome: Outcome = Outcome.OK, *, latency_ms: float = 20.0,
            attempt: int = 1, status: int | None = 200, url: str = "https://api.example/lookup?q=a.example",
            error: str | None = None, lead_id: str = LEAD.id, at: datetime | None = None) -> None:
    store.record_fetch(FetchEvent(source=source, lead_id=lead_id, identity_id="direct", url=url, method="GET",
                                  status=status, outcome=outcome, latency_ms=latency_ms, bytes=100, attempt=attempt,
                                  at=at or datetime.now(UTC), error=error))


def collected(store: StateStore, source: str, lead_id: str, *, outcome: str = "ok", records: int = 3,
              origin: str = "inbox:1", priority_class: str = "interactive") -> None:
    """A collection as the fleet runs one: queued, dispatched, a request sent, its bookkeeping done."""
    store.enqueue([(source, lead_id)], origin=origin, priority_class=priority_class)
    assert [row.lead_id for row in store.dispatch(source, limit=1)] == [lead_id]
    fetched(store, source, Outcome.OK if outcome != "failed" else Outcome.TRANSIENT, lead_id=lead_id,
            status=200 if outcome != "failed" else 503)
    store.complete_collection(source=source, lead_id=lead_id, outcome=outcome, records=records if outcome == "ok" else 0,
                              content_hash="h" if outcome != "failed" else None, path="/p" if outcome != "failed" else None,
                              run_id="run-1")


def refused_by_the_fetcher(store: StateStore, url: str) -> None:
    """The fetcher's SSRF guard refuses `url` (a private address) and logs it to the store, unsent."""
    def never(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"sent {request.url}")

    with Fetcher(sink=store, transport=httpx.MockTransport(never)) as fetcher, pytest.raises(FetchFailed) as failed:
        fetcher.fetch(CATALOG.get("api"), PlannedRequest("GET", url, {}), lead_id=LEAD.id)
    assert failed.value.reason_group == "refused"


def a_fleet(store: StateStore) -> IdentityPool:
    """Traffic, collections, a backlog, an open circuit, a dead letter, an identity pool with one
    identity resting, and api's lanes paced (its own and dc1_a's throttled, dc1_b's not): every family
    has samples. The pool's proxy and a fetch-log URL carry PASSWORD."""
    store.add_lead(LEAD, case_id="case-1")
    store.add_lead(OTHER, case_id="case-1")
    collected(store, "api", LEAD.id)
    fetched(store, "api", Outcome.THROTTLED, status=429, latency_ms=800.0)
    fetched(store, "api", Outcome.OK, attempt=2, latency_ms=1500.0)
    refused_by_the_fetcher(store, f"http://fleet:{PASSWORD}@10.0.0.1/admin")
    fetched(store, "api", Outcome.PERMANENT, status=404, url=f"https://fleet:{PASSWORD}@api.example/lookup",
            error=f"HTTP 404 from https://fleet:{PASSWORD}@api.example/lookup")  # written as given, unredacted
    collected(store, "quiet", LEAD.id, outcome="empty")
    store.enqueue([("api", OTHER.id)], origin="recurring:1", priority_class="recurring")
    store.enqueue([("quiet", OTHER.id)], origin="backfill:1", priority_class="backfill",
                  not_before=datetime.now(UTC) + timedelta(hours=1))
    store.put_dead_letter(source="quiet", lead_id=OTHER.id, reason_group="transient", last_status=503, attempts=4,
                          last_error=f"HTTP 503 from http://fleet:{PASSWORD}@quiet.example/", now=datetime.now(UTC))
    quiet = CATALOG.get("quiet")
    for _ in range(quiet.circuit.failure_threshold):
        Circuits(store).record("quiet", quiet.circuit, success=False)
    pool = IdentityPool(store, parse_identities("""
tiers: [datacenter]
identities:
  - {id: dc1_a, range: dc1, tier: datacenter, proxy_url: "http://fleet:${PROXY_PASS}@127.0.0.9:8080"}
  - {id: dc1_b, range: dc1, tier: datacenter}
""", env={"PROXY_PASS": PASSWORD}), rng=random.Random(1))
    lease = pool.acquire("api", holder="run-abc", ttl_s=60)
    assert lease is not None
    pool.report(lease, "identity_fault", status=403)  # a hard block: it rests at api
    assert pool.acquire("api", holder="run-def", ttl_s=60) is not None
    api, lanes = CATALOG.get("api"), RateLanes(store, sampler=GapSampler(random.Random(1)))
    for sent, outcome in (([source_lane(api)], Outcome.THROTTLED), ([identity_lane(api, "dc1_a")], Outcome.THROTTLED),
                          ([identity_lane(api, "dc1_b")], Outcome.OK)):
        lanes.feedback(sent, outcome=outcome, retry_after_s=None, throttle=api.throttle)
    return pool


def test_every_family_has_its_type_and_labels(store: StateStore) -> None:
    pool = a_fleet(store)
    found = families(fleet_registry(store, CATALOG))
    expected = {**{name: ("counter", labels) for name, labels in COUNTERS.items()},
                **{name: ("gauge", labels) for name, labels in GAUGES.items()},
                **{name: ("histogram", labels) for name, labels in HISTOGRAMS.items()}}
    assert {name: family.type for name, family in found.items()} == {name: t for name, (t, _) in expected.items()}
    for name, (kind, labels) in expected.items():
        assert found[name].samples, name
        if kind == "histogram":
            assert {(sample.name.removeprefix(name), tuple(sorted(sample.labels))) for sample in found[name].samples} == {
                ("_bucket", tuple(labels)), ("_count", ("source",)), ("_sum", ("source",))}, name
            continue
        assert {tuple(sorted(sample.labels)) for sample in found[name].samples} == {tuple(labels)}, name
        if kind == "counter":
            assert {sample.name for sample in found[name].samples} == {f"{name}_total"}, name
    # No precomputed rate, ratio or percentile is served any more.
    assert not [name for name in found if re.search(r"_per_min$|_rate$|_share$|_p50_ms$|_p95_ms$|_per_usd$", name)]
    pool.close()


def test_the_figures_read_what_the_store_holds(store: StateStore) -> None:
    pool = a_fleet(store)
    got = samples(fleet_registry(store, CATALOG))

    def one(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted(labels.items())))]

    assert one("investigations_requests_total", source="api", outcome="ok") == 2
    assert one("investigations_requests_total", source="api", outcome="throttled") == 1
    assert one("investigations_requests_total", source="api", outcome="permanent") == 2  # refused, and a 404
    assert one("investigations_requests_total", source="quiet", outcome="blocked") == 0  # every outcome, from 0
    assert one("investigations_retries_total", source="api") == 1
    assert one("investigations_refusals_total", source="api") == 1
    assert one("investigations_refusals_total", source="quiet") == 0
    assert one("investigations_response_bytes_total", source="api") == 400  # the refused one got no answer
    assert one("investigations_collections_total", source="api", outcome="ok") == 1
    assert one("investigations_collections_total", source="quiet", outcome="empty") == 1
    assert one("investigations_collections_total", source="quiet", outcome="failed") == 0
    assert one("investigations_records_total", source="api") == 3
    assert one("investigations_records_total", source="quiet") == 0  # its collection was empty
    assert one("investigations_queue_depth", source="api", priority_class="recurring", state="ready") == 1
    assert one("investigations_queue_depth", source="quiet", priority_class="backfill", state="waiting") == 1
    assert one("investigations_queue_depth", source="api", priority_class="interactive", state="dispatched") == 0
    assert one("investigations_source_backlog", source="quiet") == 1
    assert one("investigations_circuit_state", source="quiet", state="open") == 1
    assert one("investigations_circuit_state", source="quiet", state="closed") == 0
    assert one("investigations_circuit_state", source="api", state="closed") == 1
    assert one("investigations_identities", source="api", state="resting") == 1
    assert one("investigations_identities", source="api", state="leased") == 1
    assert one("investigations_identities", source="quiet", state="available") == 2
    assert one("investigations_dead_letters", source="quiet") == 1
    assert one("investigations_dead_letters", source="api") == 0
    assert 0 <= one("investigations_newest_collection_age_seconds", source="api") < 60
    assert one("investigations_records_held", source="api") == 3
    assert one("investigations_monitored_leads", source="api", freshness="fresh") == 1
    assert one("investigations_monitored_leads", source="quiet", freshness="empty") == 1
    assert one("investigations_daily_budget_usd", source="api") == 3
    pool.close()


def test_the_pacing_gauges_give_each_lane_s_configured_rate_rate_in_use_and_learned_ceiling(store: StateStore) -> None:
    pool = a_fleet(store)
    found = families(fleet_registry(store, CATALOG))

    def lanes(name: str) -> dict[tuple[str, str], float]:
        return {(sample.labels["source"], sample.labels["identity"]): sample.value
                for sample in found[f"investigations_pacing_{name}"].samples}

    # api's own lane (identity "") and dc1_a's were throttled at their configured rates and halved;
    # dc1_b's never was. quiet never sent: it has no lane.
    assert lanes("configured_rate_per_second") == {("api", ""): 8, ("api", "dc1_a"): 2, ("api", "dc1_b"): 2}
    assert lanes("rate_per_second") == {("api", ""): 4, ("api", "dc1_a"): 1, ("api", "dc1_b"): 2}
    assert lanes("ceiling_rate_per_second") == {("api", ""): 8, ("api", "dc1_a"): 2}
    assert {found[f"investigations_pacing_{name}"].type for name in ("configured_rate_per_second", "rate_per_second",
                                                                      "ceiling_rate_per_second")} == {"gauge"}
    pool.close()


def test_a_source_never_collected_has_no_freshness_rather_than_0(sqlite_store: StateStore) -> None:
    collected(sqlite_store, "api", LEAD.id)
    got = families(fleet_registry(sqlite_store, CATALOG))
    assert [s.labels["source"] for s in got["investigations_newest_collection_age_seconds"].samples] == ["api"]


def test_counters_never_go_down_across_scrapes_with_collections_between(store: StateStore) -> None:
    pool = a_fleet(store)
    registry = fleet_registry(store, CATALOG)
    before = samples(registry)
    # A lead collected ok before is collected again and fails: its latest attempt (the collections
    # table) is no longer ok, yet the ok collections counted stay counted.
    collected(store, "api", LEAD.id, outcome="failed", origin="requeue:1")
    collected(store, "quiet", OTHER.id, origin="requeue:2")  # its backfill row is closed with it, not counted again
    fetched(store, "api", Outcome.TRANSIENT, status=503, attempt=2, latency_ms=31_000.0)
    after = samples(registry)
    counted = [key for key in before if key[0].endswith(("_total", "_bucket", "_count", "_sum"))]
    assert len(counted) > 40
    assert [key for key in counted if after[key] < before[key]] == []

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before[key]

    assert grew("investigations_collections_total", source="api", outcome="ok") == 0
    assert grew("investigations_collections_total", source="api", outcome="failed") == 1
    assert grew("investigations_collections_total", source="quiet", outcome="ok") == 1
    # The api lead's records stay counted though its latest collection found none; quiet's add up.
    assert grew("investigations_records_total", source="api") == 0
    assert grew("investigations_records_total", source="quiet") == 3
    assert grew("investigations_requests_total", source="api", outcome="transient") == 2
    assert grew("investigations_retries_total", source="api") == 1
    assert grew("investigations_request_duration_seconds_count", source="api") == 2
    assert grew("investigations_request_duration_seconds_bucket", source="api", le="30.0") == 1  # 31 s: only +Inf
    assert grew("investigations_request_duration_seconds_bucket", source="api", le="+Inf") == 2
    pool.close()


def test_the_latency_histogram_is_cumulative_and_counts_every_request(store: StateStore) -> None:
    latencies_ms = [10.0, 50.0, 50.5, 99.0, 420.0, 1000.0, 2600.0, 9000.0, 29_999.0, 45_000.0]
    for latency_ms in latencies_ms:
        fetched(store, "api", latency_ms=latency_ms)
    fetched(store, "quiet", Outcome.THROTTLED, status=429, latency_ms=120.0)
    found = families(fleet_registry(store, CATALOG))
    histogram = found["investigations_request_duration_seconds"]
    api = {sample.labels.get("le", sample.name): sample.value for sample in histogram.samples
           if sample.labels["source"] == "api"}
    bounds = [f"{bound:.1f}" if bound >= 1 else f"{bound:g}" for bound in LATENCY_BUCKETS_S]
    assert list(api)[:len(bounds) + 1] == [*bounds, "+Inf"]
    expected = [sum(1 for ms in latencies_ms if ms <= bound * 1000) for bound in LATENCY_BUCKETS_S]
    assert [api[le] for le in bounds] == expected == [2, 4, 4, 5, 6, 6, 7, 8, 9]  # 50 ms is in le=0.05
    counts = [api[le] for le in [*bounds, "+Inf"]]
    assert counts == sorted(counts)
    assert api["+Inf"] == api["investigations_request_duration_seconds_count"] == len(latencies_ms)
    assert api["investigations_request_duration_seconds_sum"] == pytest.approx(sum(latencies_ms) / 1000)
    requests = {sample.labels["source"]: 0.0 for sample in found["investigations_requests"].samples}
    for sample in found["investigations_requests"].samples:
        requests[sample.labels["source"]] += sample.value
    counts_by_source = {sample.labels["source"]: sample.value for sample in histogram.samples
                        if sample.name.endswith("_count")}
    assert counts_by_source == requests == {"api": 10, "quiet": 1}


def test_no_secret_reaches_the_exposition(store: StateStore) -> None:
    pool = a_fleet(store)
    assert any(PASSWORD in row["url"] and PASSWORD in row["error"] for row in store.fetch_log())  # it is in the store
    text = render(fleet_registry(store, CATALOG)).decode()
    for secret in (PASSWORD, "fleet:", "10.0.0.1", "127.0.0.9", "run-abc", "/admin", "https://"):
        assert secret not in text, secret
    # The identity whose proxy carries PASSWORD is named by its id alone, and only as its lane's label.
    naming = {line.split("{")[0] for line in text.splitlines() if "dc1_a" in line}
    assert naming == {"investigations_pacing_configured_rate_per_second", "investigations_pacing_rate_per_second",
                      "investigations_pacing_ceiling_rate_per_second"}
    assert all('identity="dc1_a"' in line for line in text.splitlines() if "dc1_a" in line)
    pool.close()


def test_the_process_registry_is_left_alone(sqlite_store: StateStore) -> None:
    fetched(sqlite_store, "api")
    assert b"investigations_requests_total" in render(fleet_registry(sqlite_store, CATALOG))
    assert b"investigations_" not in generate_latest(REGISTRY)


def test_a_long_lived_reader_folds_settled_rows_and_agrees_with_a_fresh_read(sqlite_store: StateStore) -> None:
    """The collector's reader keeps the totals of rows SETTLE old and reads only newer ones; what it
    gives is what reading the whole store afresh gives, scrape after scrape."""
    now = datetime.now(UTC)
    reader = TotalsReader(sqlite_store, settle=timedelta(minutes=10))
    for minutes in (40, 30, 20):
        fetched(sqlite_store, "api", latency_ms=minutes * 10.0, at=now - timedelta(minutes=minutes))
    collected(sqlite_store, "api", LEAD.id)
    fetched(sqlite_store, "api", Outcome.THROTTLED, status=429, at=now - timedelta(minutes=1))  # not settled yet
    first = reader.read(now=now)
    assert first == read_totals(sqlite_store, now=now)
    assert reader._log_through == 3  # the three settled rows; the two recent ones are read each time
    fetched(sqlite_store, "quiet", Outcome.BLOCKED, status=403, latency_ms=70.0, at=now)
    collected(sqlite_store, "quiet", LEAD.id, outcome="failed")
    later = now + timedelta(minutes=30)
    second = reader.read(now=later)
    assert second == read_totals(sqlite_store, now=later)
    assert reader._log_through == 7 and reader._queue_through == 2  # everything settled, every queue row done
    assert sum(t.requests for t in second.requests.values()) == 7
    assert second.collections == {("api", "ok"): 1, ("quiet", "failed"): 1}


def test_a_reader_whose_store_started_over_reads_it_afresh(sqlite_store: StateStore) -> None:
    now = datetime.now(UTC)
    reader = TotalsReader(sqlite_store, settle=timedelta(minutes=10))
    for minutes in (40, 30):
        fetched(sqlite_store, "api", at=now - timedelta(minutes=minutes))
    assert sum(t.requests for t in reader.read(now=now).requests.values()) == 2
    with sqlite_store.engine.begin() as conn:  # no write path empties the fetch log: a restored backup does
        conn.execute(s.fetch_log.delete())
    fetched(sqlite_store, "quiet", at=now - timedelta(minutes=30))
    assert reader.read(now=now) == read_totals(sqlite_store, now=now)


def _metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (PromQL's functions and keywords are not `investigations_`)."""
    return set(re.findall(r"\binvestigations_[a-z0-9_]+", expr))


def test_every_metric_a_dashboard_panel_uses_is_scraped(store: StateStore) -> None:
    pool = a_fleet(store)
    scraped = {name for name, _ in samples(fleet_registry(store, CATALOG))}
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] == 39
    assert [item["name"] for item in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    expressions = {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in panels}
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert all(target["datasource"]["uid"] == "${DS_PROMETHEUS}" for target in panel["targets"]), panel["title"]
    used: set[str] = set()
    for title, exprs in expressions.items():
        assert exprs and all(_metric_names(expr) for expr in exprs), title
        used |= {name for expr in exprs for name in _metric_names(expr)}
    for variable in dashboard["templating"]["list"]:
        used |= _metric_names(variable["definition"]) | _metric_names(variable["query"]["query"])
    assert used - scraped == set()
    wanted = {
        "Requests/s by source and outcome": "sum by (source, outcome) (rate(investigations_requests_total",
        "Collections/s by source and outcome": "rate(investigations_collections_total",
        "Retry ratio": "rate(investigations_retries_total",
        "Refusal ratio": "rate(investigations_refusals_total",
        "Request latency p50 / p95": "histogram_quantile(0.95, sum by (source, le) (rate("
                                     "investigations_request_duration_seconds_bucket",
        "Queue depth": "investigations_queue_depth",
        "Freshness": "investigations_newest_collection_age_seconds",
        "Identities by state": "investigations_identities",
        "Circuits": "investigations_circuit_state",
        "Dead letters": "investigations_dead_letters",
    }
    for title, fragment in wanted.items():
        assert any(fragment in expr for expr in expressions[title]), title
    pool.close()


def test_the_leads_gauge_counts_active_and_retired_leads(sqlite_store: StateStore) -> None:
    leads = [normalize_lead("domain", f"lead{n}.example") for n in range(3)]
    sqlite_store.add_leads(leads, case_id="case-1")
    sqlite_store.mark_retired([leads[0].id])
    samples = families(fleet_registry(sqlite_store, CATALOG))["investigations_leads"].samples
    assert {sample.labels["partitions"]: sample.value for sample in samples} == {"active": 2.0, "retired": 1.0}
