"""Recurring crawls: monitored leads whose last success is older than their source's cadence.

Each source's `recrawl_every` says how fast it changes. Every tick this sensor queues, per source,
the monitored leads that are due, as `recurring` work in the fleet's backlog, starting at a
jittered moment within the window (`investigations.scheduling.dispatch.plan_recurring` decides; this sensor only
reports). The `new_leads` sensor, the one dispatcher, hands that work to Dagster in batch runs. A
source is skipped, with the reason, while its circuit rests or its backlog is full.
"""

from dagster import DefaultSensorStatus, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from assets.jobs import SourceJob
from investigations.pacing import Circuits
from investigations.scheduling.dispatch import plan_recurring
from investigations.sources.specs import SourceCatalog
from resources.fleet import FleetResource

RECURRING_SENSOR = "recurring_crawls"
INTERVAL_S = 60


def build_recurring_sensor(catalog: SourceCatalog, jobs: list[SourceJob]) -> SensorDefinition:
    @sensor(
        name=RECURRING_SENSOR,
        jobs=jobs,
        minimum_interval_seconds=INTERVAL_S,
        default_status=DefaultSensorStatus.RUNNING,
        description="Queues monitored leads (in active cases) whose last success is older than their source's "
        "recrawl_every; the new_leads sensor dispatches them as batch runs.",
    )
    def recurring_crawls(context: SensorEvaluationContext, fleet: FleetResource) -> SensorResult:
        plans = plan_recurring(fleet.store, catalog, circuits=Circuits(fleet.store))
        summary = "; ".join(
            f"{p.source}: skipped, {p.skipped}" if p.skipped else f"{p.source}: {p.due} due, {p.queued} queued"
            for p in plans
        )
        context.log.info(summary)
        return SensorResult(skip_reason=f"queued for dispatch by new_leads: {summary}")

    return recurring_crawls
