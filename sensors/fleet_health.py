"""Refresh fleet/health and every fleet/sources/<source> every minute, so the figures plot as time
series in the UI.

The sensor computes the figures in its tick and reports them as materializations of fleet/health
and of each source's own asset (Dagster's `SensorResult.asset_events`), with no run. A run a minute cost a run worker's start each
time (imports, instance, resources: 2-3 s of CPU on a 2-core machine, sampled from /proc in the
product bench) and put 1,440 runs a day on the Runs page; a tick of this sensor lasts 0.1-0.5 s
(`make run`'s demo fleet, from the tick records)."""

from dagster import (
    AssetMaterialization,
    DefaultSensorStatus,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from assets.fleet import HEALTH_KEY, fleet_health_metadata, healthy_check, source_health_key
from resources.fleet import FleetResource

FLEET_HEALTH_SENSOR = "fleet_health_every_minute"
# Every minute: the figures' window is 15 min, so a point a minute shows a trend.
INTERVAL_S = 60


@sensor(
    name=FLEET_HEALTH_SENSOR,
    minimum_interval_seconds=INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Reports fleet/health (every source's verdict) and each fleet/sources/<source> (its figures) once "
                "a minute, without a run.",
)
def fleet_health_every_minute(context: SensorEvaluationContext, fleet: FleetResource) -> SensorResult:
    overview, per_source = fleet_health_metadata(fleet)
    unhealthy = overview["unhealthy"].value
    return SensorResult(
        asset_events=[AssetMaterialization(asset_key=HEALTH_KEY, metadata=overview),
                      *(AssetMaterialization(asset_key=source_health_key(source), metadata=metadata)
                        for source, metadata in per_source.items()),
                      *(healthy_check(source, metadata) for source, metadata in per_source.items())],
        skip_reason=f"fleet/health reported; unhealthy: {', '.join(unhealthy) or 'none'}",
    )
