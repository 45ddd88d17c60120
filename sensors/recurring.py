"""Recurring crawls: monitored leads whose cadence has come round.

A source on a fixed cadence (`recrawl_every`) collects every lead again once its last success is
that old; on a learned one (`recrawl: {min, max}`) each lead gets the interval its history of
changes earned, within the source's budget (`investigations.scheduling.cadence`). Every tick this
sensor queues, per source, the monitored leads that are due, as `recurring` work in the fleet's
backlog, starting at a
jittered moment within the window (`investigations.scheduling.dispatch.plan_recurring` decides; this sensor only
reports). The `new_leads` sensor, the one dispatcher, hands that work to Dagster in batch runs. A
source is skipped, with the reason, while its circuit rests, its backlog is full or its budget is
spent.

The same pass follows each source's canaries: a failing canary is collected again every few
minutes, and once the source passes again, the leads its incident left empty or failed are queued
again (`investigations.scheduling.dispatch.requeue_recovered`), without waiting for the cadence.
"""

from dagster import DefaultSensorStatus, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from assets.jobs import SourceJob
from investigations.pacing import Circuits
from investigations.scheduling.dispatch import RecurringPlan, plan_recurring
from investigations.sources.specs import SourceCatalog
from resources.fleet import FleetResource

RECURRING_SENSOR = "recurring_crawls"
INTERVAL_S = 60


def build_recurring_sensor(catalog: SourceCatalog, jobs: list[SourceJob], *,
                           interval_s: float = INTERVAL_S) -> SensorDefinition:
    """The sensor, ticking every `interval_s` (the `INVESTIGATIONS_RECURRING_EVERY` setting)."""

    @sensor(
        name=RECURRING_SENSOR,
        jobs=jobs,
        minimum_interval_seconds=max(1, round(interval_s)),
        default_status=DefaultSensorStatus.RUNNING,
        description="Queues monitored leads (in active cases) whose cadence has come round (their source's "
        "recrawl_every, or the interval each lead's changes earned within its source's recrawl bounds and budget), "
        "the sources' canaries, and, once a source's canaries pass again, the leads its incident left empty or "
        "failed; the new_leads sensor dispatches them as batch runs.",
    )
    def recurring_crawls(context: SensorEvaluationContext, fleet: FleetResource) -> SensorResult:
        plans = plan_recurring(fleet.store, catalog, circuits=Circuits(fleet.store))
        summary = "; ".join(describe(p) for p in plans)
        # Said at INFO (the console under `make run`) only when it queued work: an idle fleet's tick
        # says nothing new every minute. The tick's skip reason in the UI says it either way.
        (context.log.info if queued_any(plans) else context.log.debug)(summary)
        return SensorResult(skip_reason=f"queued for dispatch by new_leads: {summary}")

    return recurring_crawls


def queued_any(plans: list[RecurringPlan]) -> bool:
    """Whether a tick queued anything: due leads, canaries or leads its recovery queued again."""
    return any(plan.queued or plan.canaries or plan.recovered for plan in plans)


def describe(plan: RecurringPlan) -> str:
    """One source's part of a tick's summary."""
    done = f"skipped, {plan.skipped}" if plan.skipped else f"{plan.due} due, {plan.queued} queued"
    text = f"{plan.source}: {done}"
    if plan.median_interval_s is not None:
        text += f", learned cadence median {about(plan.median_interval_s)}"
        if plan.budget_short:
            text += " (budget short: every lead at its max)"
    if plan.canaries:
        text += f", {plan.canaries} canary lead(s) queued"
    if plan.recovered:
        text += f", {plan.recovered} empty or failed during its canary incident queued again"
    if plan.failing_since is not None:
        text += f" (canaries failing since {plan.failing_since:%Y-%m-%d %H:%M} UTC)"
    return text


def about(seconds: float) -> str:
    """A duration to a tenth of its largest unit: `14h`, `2.5d`, `45m`."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{round(seconds / size, 1):g}{unit}"
    return f"{round(seconds):g}s"
