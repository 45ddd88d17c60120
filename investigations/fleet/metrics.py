"""The fleet figures in Prometheus' text format (`GET /metrics` on the intake).

A custom collector computes `investigations.fleet.stats` on every scrape rather than counting in
module-global counters: each process of the fleet writes the state store, not this one, so only
the store knows the whole fleet's figures, and a restarted intake loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from investigations.fleet.stats import DEFAULT_WINDOW_S, HEALTH_STATES, NUMERIC_FIGURES, fleet_figures
from investigations.pacing import Circuits
from investigations.sources.specs import SourceCatalog
from investigations.store import StateStore

PREFIX = "investigations_source_"


class FleetCollector(Collector):
    """One gauge per fleet figure, labelled by source, and `investigations_source_health` with one
    series per verdict (1 for the source's current one, 0 for the others). A figure that has no
    value (a rate without requests) is left out for that source rather than reported as 0."""

    def __init__(self, store: StateStore, catalog: SourceCatalog, *, window_s: float = DEFAULT_WINDOW_S,
                 data_dir: Path | None = None) -> None:
        self._store = store
        self._catalog = catalog
        self._window_s = window_s
        self._data_dir = data_dir

    def collect(self) -> Iterator[GaugeMetricFamily]:
        circuits = {source: state.state for source, state in Circuits(self._store).all_states().items()}
        figures = fleet_figures(self._store, self._catalog, window_s=self._window_s, circuits=circuits,
                                data_dir=self._data_dir)
        health = GaugeMetricFamily(f"{PREFIX}health", "the source's health verdict (1: current)",
                                   labels=["source", "health"])
        for f in figures:
            for state in HEALTH_STATES:
                health.add_metric([f.source, state], 1.0 if f.health == state else 0.0)
        yield health
        for name, help_text in NUMERIC_FIGURES.items():
            gauge = GaugeMetricFamily(f"{PREFIX}{name}", help_text, labels=["source"])
            for f in figures:
                value = getattr(f, name)
                if value is not None:
                    gauge.add_metric([f.source], float(value))
            yield gauge


def fleet_registry(store: StateStore, catalog: SourceCatalog, *, window_s: float = DEFAULT_WINDOW_S,
                   data_dir: Path | None = None) -> CollectorRegistry:
    """A registry of its own holding only the fleet collector (not the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(store, catalog, window_s=window_s, data_dir=data_dir))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in the text exposition format (reads the store: call off the event loop)."""
    return generate_latest(registry)
