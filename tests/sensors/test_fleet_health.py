"""fleet_health_every_minute reports fleet/health and each fleet/sources/<source> from its tick, without a run."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import AssetCheckEvaluation, AssetMaterialization, DagsterInstance, SensorResult, build_sensor_context

from assets.fleet import HEALTH_KEY, source_health_key
from investigations.collection.events import FetchEvent, Outcome
from investigations.config import Settings
from investigations.sources.catalog import load_catalog
from investigations.store import StateStore
from resources.fleet import FleetResource
from sensors.fleet_health import fleet_health_every_minute


def test_a_tick_reports_fleet_health_and_each_source_s_own_figures_and_requests_no_run(sandbox_env) -> None:
    store = StateStore.from_url(Settings.from_env().database_url)
    for _ in range(2):
        store.record_fetch(FetchEvent(source="robust", lead_id="l", identity_id="direct", url="https://x.example/",
                                      method="GET", status=403, outcome=Outcome.BLOCKED, latency_ms=30.0, bytes=10,
                                      attempt=1, at=datetime.now(UTC)))
    with DagsterInstance.ephemeral() as instance, build_sensor_context(
            instance=instance, resources={"fleet": FleetResource()}) as context:
        result = fleet_health_every_minute(context)
    assert isinstance(result, SensorResult) and not result.run_requests
    events = {event.asset_key: event for event in result.asset_events if isinstance(event, AssetMaterialization)}
    checks = {event.asset_key.path[-1]: event for event in result.asset_events
              if isinstance(event, AssetCheckEvaluation)}
    assert not checks["robust"].passed and checks["robust"].check_name == "healthy"
    assert "blocked" in (checks["robust"].description or "") and checks["fragile"].passed
    assert "robust" in events[HEALTH_KEY].metadata["unhealthy"].value
    robust = events[source_health_key("robust")].metadata
    assert robust["health"].value == "blocked" and robust["requests_per_min"].value == 2 / 15
    assert {key for key in events if key != HEALTH_KEY} == {source_health_key(s.name) for s in load_catalog(
        Settings.from_env().sources_path).sources}
    assert result.skip_reason is not None and "unhealthy: robust" in result.skip_reason.skip_message
