"""Runs that ended without collecting what they were handed give it back to the fleet's queue.

A run worker killed mid-batch, a run stuck in STARTING that run monitoring failed, a run stopped at
its `dagster/max_runtime`, a terminated run: Dagster marks the run FAILURE or CANCELED, and the
leads it still owed stay `dispatched` in the fleet's queue. Dagster's own run retries
(`run_retries` in dagster.yaml) re-run a crashed run first, with the same handover, and the retry
collects only what is still owed. Once a run ends for good (no retry coming), this sensor reads it
from Dagster's run records and hands its rows to `investigations.scheduling.dispatch.release_dead_run`: they go
out again under a new run key within seconds, instead of after the 30-minute stale timer.

It also gives back rows dispatched for two minutes or more that no run owns any more: a `new_leads`
tick claimed them and died before their run was created (the daemon or the code server killed
mid-tick), or their run failed and Dagster promised a retry (`dagster/will_retry`) that has not come
RETRY_PROMISE_S after it ended. Seen in the fault suite on Postgres: a run worker killed while the
daemon restarted was marked for retry and never re-run, and its lead stayed dispatched.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from investigations.scheduling.dispatch import release_dead_run, release_orphaned_dispatches
from investigations.scheduling.priority import HANDOVER_TAG
from resources.fleet import FleetResource

DEAD_RUNS_SENSOR = "requeue_dead_runs"
INTERVAL_S = 5
MAX_RUNS_PER_TICK = 200
ENDED = [DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED]
# Set by Dagster on a failed run that its run retries will re-run.
WILL_RETRY_TAG = "dagster/will_retry"
# How long a failed run's retry may take to appear (Dagster's retry daemon re-runs a failure within
# seconds) before its leads are taken as nobody's and go back to the queue.
RETRY_PROMISE_S = 120.0


def retry_may_come(run: DagsterRun, instance: DagsterInstance) -> bool:
    """Whether Dagster will re-run this failed run, or may still say it will: it said so
    (`dagster/will_retry`), or it has not said yet with run retries on. Dagster stores the failure
    first and tags it a moment later (the tag bumps the run's update time, so a later tick reads
    it again): until then the retry may still come, and the run's leads stay with it."""
    if run.status != DagsterRunStatus.FAILURE:
        return False
    said = run.tags.get(WILL_RETRY_TAG)
    return said == "true" or (said is None and instance.run_retries_enabled)


def owned_handovers(instance: DagsterInstance, keys: Sequence[str], *, now_s: float) -> set[str]:
    """Of `keys`, the handovers a run still owns: one not finished, or one that failed less than
    RETRY_PROMISE_S ago and whose retry Dagster promised or may still promise. A retry carries the
    same handover, so once it exists it owns the key by the first rule."""
    owned: set[str] = set()
    for record in instance.get_run_records(RunsFilter(tags={HANDOVER_TAG: list(keys)})):
        run = record.dagster_run
        key = run.tags.get(HANDOVER_TAG)
        if key is None:
            continue
        if not run.is_finished:
            owned.add(key)
            continue
        ended_s = record.end_time if record.end_time is not None else record.update_timestamp.timestamp()
        if retry_may_come(run, instance) and now_s - ended_s < RETRY_PROMISE_S:
            owned.add(key)
    return owned


def build_dead_runs_sensor() -> SensorDefinition:
    @sensor(name=DEAD_RUNS_SENSOR, minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
            description="Gives the leads a failed or canceled collection run still owed back to the fleet's "
            "queue (to be handed over again under a new run key), once Dagster's run retries are done; "
            "a lead whose runs died 3 times becomes a `crashed` dead letter.")
    def requeue_dead_runs(context: SensorEvaluationContext, fleet: FleetResource) -> SensorResult:
        since = float(context.cursor) if context.cursor else datetime.now(UTC).timestamp() - 3600
        records = context.instance.get_run_records(
            RunsFilter(statuses=ENDED, updated_after=datetime.fromtimestamp(since, UTC)),
            limit=MAX_RUNS_PER_TICK, order_by="update_timestamp", ascending=True,
        )
        cursor, notes = since, []
        for record in records:
            cursor = max(cursor, record.update_timestamp.timestamp())
            run = record.dagster_run
            handover = run.tags.get(HANDOVER_TAG)
            if not handover or retry_may_come(run, context.instance):
                continue  # its retry collects what it owes
            requeued, spent = release_dead_run(fleet.store, handover, why=f"run {run.run_id} {run.status.value}")
            if requeued or spent:
                notes.append(f"run {run.run_id} ({run.status.value}): {requeued} requeued, "
                             f"{len(spent)} dead-lettered as crashed")
        orphans = release_orphaned_dispatches(fleet.store, owned=lambda keys: owned_handovers(
            context.instance, keys, now_s=datetime.now(UTC).timestamp()))
        if orphans:
            notes.append(f"{orphans} dispatched collection(s) no run owns (never created, or a retry that never "
                         "came) given back to the queue")
        for note in notes:
            context.log.info(note)
        return SensorResult(skip_reason="; ".join(notes) or f"{len(records)} ended run(s), nothing owed",
                            cursor=str(cursor))

    return requeue_dead_runs
