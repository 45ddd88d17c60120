"""Recurring crawls: monitored leads whose last success is older than their source's cadence.

Each source's `recrawl_every` says how fast it changes. Every tick this sensor queues, per source,
the monitored leads that are due, as `recurring` work in the fleet's backlog, starting at a
jittered moment within the window. The `new_leads` sensor, the one dispatcher, hands that work to
Dagster in batch runs (one dispatcher: it alone adds new leads to the partitions). It skips a
source, and says why, while its circuit rests or its backlog is full.
"""

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from dagster import DefaultSensorStatus, SensorDefinition, SensorEvaluationContext, SensorResult, sensor

from assets.jobs import SourceJob
from investigations.pacing import Circuits, jittered_start_s
from investigations.priority import PriorityClass
from investigations.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore, utcnow
from resources.fleet import FleetResource

RECURRING_SENSOR = "recurring_crawls"
INTERVAL_S = 60
# Leads queued per source per tick; the rest are picked up on the next ticks, stalest first.
MAX_DUE_PER_SOURCE = 500
# A source whose backlog holds this many times its max_in_flight is not given more recurring work.
BACKLOG_FACTOR = 5
# Start times spread over this share of the window (at most MAX_SPREAD_S), so crawls of many leads
# and sources do not all start on the same tick.
START_SPREAD = 0.1
MAX_SPREAD_S = 600.0


@dataclass(frozen=True)
class RecurringPlan:
    source: str
    window: int
    due: int
    queued: int
    skipped: str | None = None


def window_of(spec: SourceSpec, now: datetime) -> int:
    """The cadence window `now` falls in: queue origins (and so run keys) are unique per window."""
    return int(now.timestamp() // spec.recrawl_every_s)


def plan_recurring(
    store: StateStore, catalog: SourceCatalog, *, now: datetime | None = None, circuits: Circuits | None = None
) -> list[RecurringPlan]:
    """Queue every source's due monitored leads for this window; return what was done and skipped."""
    now = now or utcnow()
    depths = store.queue_depths(now=now)
    plans = []
    for spec in catalog.sources:
        window = window_of(spec, now)
        state = circuits.state(spec.name) if circuits else None
        if state is not None and state.state != "closed":
            plans.append(RecurringPlan(spec.name, window, 0, 0, f"circuit {state.state}"))
            continue
        depth = depths.get(spec.name, {})
        backlog = sum(depth.values())
        if backlog >= BACKLOG_FACTOR * spec.max_in_flight:
            plans.append(RecurringPlan(spec.name, window, 0, 0, f"backlog full ({backlog} collections waiting)"))
            continue
        due = store.stale_monitored(spec.name, lead_kinds=spec.lead_kinds,
                                    older_than=now - timedelta(seconds=spec.recrawl_every_s), limit=MAX_DUE_PER_SOURCE)
        # Seeded by source and window: re-evaluating a tick draws the same start, nothing moves.
        rng = random.Random(f"{spec.name}:{window}")
        start = now + timedelta(seconds=jittered_start_s(min(spec.recrawl_every_s, MAX_SPREAD_S / START_SPREAD),
                                                         rng=rng, spread=START_SPREAD))
        queued = store.enqueue([(spec.name, lead) for lead in due], origin=f"recurring:{window}",
                               priority_class=PriorityClass.RECURRING.value, not_before=start, now=now)
        plans.append(RecurringPlan(spec.name, window, len(due), queued))
    return plans


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
