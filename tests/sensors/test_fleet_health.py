"""fleet_health_every_minute reports fleet/health from its tick, without a run."""

from __future__ import annotations

from datetime import UTC, datetime

from dagster import AssetMaterialization, DagsterInstance, SensorResult, build_sensor_context

from assets.fleet import HEALTH_KEY
from investigations.collection.events import FetchEvent, Outcome
from investigations.config import Settings
from investigations.store import StateStore
from resources.fleet import FleetResource
from sensors.fleet_health import fleet_health_every_minute


def test_a_tick_reports_fleet_health_with_each_source_s_figures_and_requests_no_run(sandbox_env) -> None:
    store = StateStore.from_url(Settings.from_env().database_url)
    for _ in range(2):
        store.record_fetch(FetchEvent(source="robust", lead_id="l", identity_id="direct", url="https://x.example/",
                                      method="GET", status=403, outcome=Outcome.BLOCKED, latency_ms=30.0, bytes=10,
                                      attempt=1, at=datetime.now(UTC)))
    with DagsterInstance.ephemeral() as instance, build_sensor_context(
            instance=instance, resources={"fleet": FleetResource()}) as context:
        result = fleet_health_every_minute(context)
    assert isinstance(result, SensorResult) and not result.run_requests
    (event,) = result.asset_events
    assert isinstance(event, AssetMaterialization) and event.asset_key == HEALTH_KEY
    assert event.metadata["robust/health"].value == "blocked"
    assert event.metadata["robust/requests_per_min"].value == 2 / 15
    assert result.skip_reason is not None and "unhealthy: robust" in result.skip_reason.skip_message
