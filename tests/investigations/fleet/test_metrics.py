"""The `/metrics` collector reads the fleet figures from the store on every scrape."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from investigations.collection.events import FetchEvent, Outcome
from investigations.fleet.metrics import fleet_registry, render
from investigations.fleet.stats import NUMERIC_FIGURES
from investigations.sources.specs import parse_sources

CATALOG = parse_sources("""
sources:
  - name: api
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://api.example/lookup?q={value}"}
    daily_budget_usd: 3
""")


def scrape(registry) -> dict[str, dict[tuple, float]]:
    return {family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
            for family in text_string_to_metric_families(render(registry).decode())}


def test_each_scrape_reads_the_store_anew(sqlite_store) -> None:
    registry = fleet_registry(sqlite_store, CATALOG, window_s=60)
    before = scrape(registry)
    assert before["investigations_source_requests_per_min"] == {(("source", "api"),): 0.0}
    assert before["investigations_source_daily_budget_usd"] == {(("source", "api"),): 3.0}
    assert not before.get("investigations_source_latency_p50_ms")  # no requests: no latency, rather than 0
    sqlite_store.record_fetch(FetchEvent(source="api", lead_id="l", identity_id="direct", url="https://api.example/",
                                         method="GET", status=200, outcome=Outcome.OK, latency_ms=25.0, bytes=10,
                                         attempt=1, at=datetime.now(UTC)))
    after = scrape(registry)
    assert after["investigations_source_requests_per_min"] == {(("source", "api"),): 1.0}
    assert after["investigations_source_latency_p50_ms"] == {(("source", "api"),): 25.0}


def test_every_figure_is_a_gauge_and_the_process_registry_is_left_alone(sqlite_store) -> None:
    registry = fleet_registry(sqlite_store, CATALOG)
    families = {f.name: f for f in text_string_to_metric_families(render(registry).decode())}
    assert {f"investigations_source_{name}" for name in NUMERIC_FIGURES} | {"investigations_source_health"} == set(
        families)
    assert {f.type for f in families.values()} == {"gauge"}
    assert b"investigations_source" not in generate_latest(REGISTRY)
