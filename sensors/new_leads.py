"""The new-lead sensor: inbox rows become queued collections; queued collections become runs.

Three steps per tick. Sync: every lead registered since the last tick (by the intake, the CLI, a
case import) joins Dagster's `leads` partitions (`lead_partitions`), so background work batches from
its first lead; once a minute a lifecycle pass retires the leads no open case holds and brings back
the ones a case took up again. Ingest: every inbox row after the cursor is queued once per wanted source in the
fleet's own backlog (`collection_queue`). Dispatch: the engine's dispatcher
(`investigations.scheduling.dispatch`) decides what each source hands over and why the rest waits; this module
only turns its answer into run requests.

A tick with nothing to do waits for the inbox instead of returning at once: the daemon starts a
sensor's tick at most once per loop (5 s), so a lead arriving just after an empty tick would wait
up to 5 s for the next one. Waiting inside the tick, and returning as soon as a lead arrives, turns
that into the poll interval. The wait lasts most of 30 s, not one loop: every tick costs the code
server a Dagster instance (about 25 ms of CPU for that alone) and the sensor's resources, and the
daemon its tick records, whether or not a lead came, so short ticks kept an idle fleet busy. While it
waits, `new_leads` syncs the partitions and plans its backlog again every PLAN_EVERY_S (as often as
the daemon's loop once started its ticks), so background work is handed over as soon as it may go.

A tick hands its runs over only when it returns, so one waiting sensor picks up one arrival per
loop at once and the next lead waits for the next loop. Several sensors therefore take turns at the
inbox (`PICKUP_TURNS`): each wakes for the inbox rows of its turn (row id modulo the turns), so
consecutive leads wake different sensors; a row of another turn still waiting after PICKUP_GRACE_S
wakes a sensor too (the one whose turn it was may have returned with runs already). `new_leads`
(turn 0) also hands over background work and
keeps the pool limits; a relay (`new_leads_relay1`, ...) hands over interactive work only, so the
background bound is counted in one place. Two sensors that wake for the same lead (one webhook's
leads are consecutive rows) are safe: ingest is idempotent and dispatch claims each collection in
one transaction; the one that finds nothing left keeps waiting.
"""

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Protocol

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.jobs import SourceJob
from assets.naming import job_name, source_asset_key
from assets.partitions import LEADS_PARTITIONS, leads_partitions
from investigations.collection.runwork import OPEN_BEFORE_START_S
from investigations.config import DEFAULT_RETIRE_AFTER_S
from investigations.intake.leads import Lead
from investigations.pacing import Circuits
from investigations.scheduling.dispatch import DispatchPlan, Handover, ingest, max_runtime_s, order_from, plan_dispatch
from investigations.scheduling.priority import (
    BACKGROUND_TAG,
    CASE_TAG,
    CHECKS_IN_STEP_TAG,
    HANDOVER_TAG,
    PriorityClass,
    run_tags,
)
from investigations.sources.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore
from resources.fleet import FleetResource
from sensors.lead_partitions import (
    LIFECYCLE_BATCH,
    LIFECYCLE_BUDGET_S,
    LIFECYCLE_EVERY_S,
    ensure_partitions,
    lifecycle_pass,
    sync_lead_partitions,
)
from sensors.pools import sync_pool_limits

NEW_LEAD_SENSOR = "new_leads"
# Caps one tick's work: Dagster creates ~10 runs/s from one tick, and a tick has 60 s to finish. The
# inbox is queued in transactions of up to INBOX_CHUNK rows, as many as INGEST_BUDGET_S allows (a
# case of 10,000 leads over 10 sources is 100,000 collections, about 5 s on SQLite), so a big case is
# in the fleet's queue at once, not over one sensor loop per 1,000 leads; what a tick hands to Dagster
# is bounded apart, by MAX_RUNS_PER_TICK and each source's bounds.
INBOX_CHUNK = 1000
INGEST_BUDGET_S = 15.0
MAX_RUNS_PER_TICK = 100
# The daemon evaluates sensors in a loop of at least 5 s. Asking for 5 s aliases to every other loop
# (10 s; measured: ticks 9.98 s apart at the median), because a loop starts a hair under 5 s after
# the last tick; asking for less gets every loop.
INTERVAL_S = 1
# An empty tick waits this long for the inbox, polling it every INBOX_POLL_S. It ends 1.5 s before one
# of the daemon's loops (every 5 s from this tick's start, less the time the loop took to start it):
# a tick still running at a loop is skipped there, and ending just after one would leave no sensor
# waiting for 5 s. Well under the 60 s the daemon gives a sensor's evaluation.
WAIT_FOR_LEADS_S = 28.5
INBOX_POLL_S = 0.2
# While waiting, `new_leads` syncs the partitions and plans its backlog again this often: a batch
# winding down gets its successor within this, as when every tick lasted 3.5 s.
PLAN_EVERY_S = 3.5
# Sensors taking turns at the inbox: up to this many leads per loop are picked up within the poll.
PICKUP_TURNS = 2
# A row of another sensor's turn is taken after this long: that sensor's tick may have returned.
PICKUP_GRACE_S = 0.5
# A run in these states holds, or will hold, a slot of its source's pool.
IN_FLIGHT_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                      DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]


# A run tag names the lead as an investigator types it (`domain:example.com`), cut to this length.
LEAD_TAG_MAX = 200


class PartitionOrder(Protocol):
    """The position of every lead in the `leads` partitions (`partition_order_of`): read at the first
    call, cached until `cache_clear()` (after leads were added to the partitions)."""

    def __call__(self) -> Mapping[str, int]: ...

    def cache_clear(self) -> None: ...


def run_request_for(handover: Handover, order: Mapping[str, int], spec: SourceSpec,
                    keys: Mapping[str, str], lead: Lead | None = None) -> RunRequest:
    """The Dagster run of one handover. A single lead runs on its partition; a batch over the
    partition range enveloping its leads (first..last in the `leads` partition order). Either names
    its handover in a tag: the run collects the leads recorded under it that it still owes, so a
    retried run does not collect a lead twice, and a run that died gives them back by it. `keys` are
    the leads' partition keys by lead id (`kind:value`, or an older lead's id). The run key is the
    handover's, new each time a collection is handed over again. A run still going at
    `dagster/max_runtime` is stuck: run monitoring stops it, and its leads go out again."""
    tags = {**run_tags(handover.priority_class), "investigations/source": handover.source,
            "investigations/origin": handover.rows[0].origin, HANDOVER_TAG: handover.key,
            "dagster/max_runtime": str(max_runtime_s(spec, len(handover.rows), open_to_joins=(
                handover.priority_class == PriorityClass.INTERACTIVE)))}
    if handover.case_id:
        tags[CASE_TAG] = handover.case_id
    if not handover.is_batch:
        row = handover.rows[0]
        tags["investigations/lead_id"] = row.lead_id
        if lead is not None:
            # The Runs page is filtered by the lead itself with this tag (an older lead's partition
            # key is its id, and a tag filter matches a whole value).
            tags["investigations/lead"] = f"{lead.kind}:{lead.value}"[:LEAD_TAG_MAX]
        return RunRequest(job_name=job_name(handover.source), partition_key=keys.get(row.lead_id, row.lead_id),
                          run_key=handover.key, tags=tags)
    leads = sorted((keys.get(lead, lead) for lead in handover.lead_ids), key=lambda key: order[key])
    return RunRequest(
        job_name=job_name(handover.source),
        run_key=handover.key,
        tags={
            **tags,
            "dagster/asset_partition_range_start": leads[0],
            "dagster/asset_partition_range_end": leads[-1],
            "investigations/batch_size": str(len(leads)),
            CHECKS_IN_STEP_TAG: "true",
        },
        # The asset alone: its check's results are reported by the step (CHECKS_IN_STEP_TAG), and
        # Dagster plans no check row per partition of the range.
        asset_selection=[source_asset_key(handover.source)],
        asset_check_keys=[],
    )


def run_requests_for(store: StateStore, instance: DagsterInstance, plan: DispatchPlan,
                     order: PartitionOrder, catalog: SourceCatalog) -> list[RunRequest]:
    """The run requests of a dispatch plan. Every lead of a batch, or joining an open run, is made a
    partition first (a lead registered after this tick's sync; an open run reports a joined lead's
    materialization within a second); each handover's rows are recorded under its key, and an
    interactive run is open to fresh leads from its request on. Rows whose open run closed before
    they reached it go out as a run of their own."""
    handovers = plan.handovers
    positions: Mapping[str, int] = {}
    keys = store.partition_keys_of([lead for handover in handovers for lead in handover.lead_ids])
    early = [keys.get(lead, lead) for handover in handovers if handover.is_batch or handover.joins
             for lead in handover.lead_ids]
    if early:
        positions = order()
        if ensure_partitions(instance, early, positions):
            order.cache_clear()
            positions = order()
    requests = []
    for handover in handovers:
        row_ids = [row.id for row in handover.rows]
        if handover.joins is not None:
            if store.join_collector(handover.joins, row_ids, now_s=time.time()):
                continue
            handover = replace(handover, joins=None)
        store.assign_handover(row_ids, handover_key=handover.key)
        if handover.priority_class == PriorityClass.INTERACTIVE:
            # Open to fresh leads of its source from now on, while it waits to start, too.
            store.open_collector(handover.key, handover.source, until_s=time.time() + OPEN_BEFORE_START_S)
        spec = catalog.get(handover.source)
        requests.append(run_request_for(handover, positions, spec, keys) if handover.is_batch
                        else run_request_for(handover, {}, spec, keys, store.get_lead(handover.rows[0].lead_id)))
    return requests


def partition_order_of(instance: DagsterInstance) -> PartitionOrder:
    """The position of every lead in the `leads` partitions, read once per tick and only if needed."""

    @cache
    def order() -> Mapping[str, int]:
        keys = instance.get_dynamic_partitions(LEADS_PARTITIONS)
        return {key: position for position, key in enumerate(keys)}

    return order


def background_runs_of(instance: DagsterInstance) -> Callable[[str], int]:
    """Counts a source's background runs that are queued or running, from Dagster's run records."""

    def count(source: str) -> int:
        return instance.get_runs_count(RunsFilter(job_name=job_name(source), statuses=IN_FLIGHT_STATUSES,
                                                  tags={BACKGROUND_TAG: "true"}))

    return count


def read_cursor(cursor: str | None) -> tuple[int, datetime | None, float]:
    """The inbox row last read, the lead-partition sync's watermark and when the last lifecycle pass
    ran (epoch seconds; older cursors: a bare row id, or no pass)."""
    if not cursor:
        return 0, None, 0.0
    if cursor.isdigit():
        return int(cursor), None, 0.0
    state = json.loads(cursor)
    since = state.get("leads_since")
    return (int(state.get("inbox", 0)), datetime.fromisoformat(since) if since else None,
            float(state.get("lifecycle_at", 0.0)))


def write_cursor(inbox: int, leads_since: datetime | None, lifecycle_at: float = 0.0) -> str:
    return json.dumps({"inbox": inbox, "leads_since": leads_since.isoformat() if leads_since else None,
                       "lifecycle_at": lifecycle_at})


def sensor_name(turn: int) -> str:
    """The name of the sensor taking `turn` at the inbox: `new_leads`, then its relays."""
    return NEW_LEAD_SENSOR if turn == 0 else f"{NEW_LEAD_SENSOR}_relay{turn}"


def build_new_lead_sensors(catalog: SourceCatalog, jobs: list[SourceJob], *, turns: int = PICKUP_TURNS,
                           **options: Any) -> list[SensorDefinition]:
    """`new_leads` and its relays, one sensor per turn at the inbox."""
    return [build_new_lead_sensor(catalog, jobs, turn=turn, turns=turns, **options) for turn in range(turns)]


def build_new_lead_sensor(
    catalog: SourceCatalog,
    jobs: list[SourceJob],
    *,
    turn: int = 0,
    turns: int = 1,
    wait_for_leads_s: float = WAIT_FOR_LEADS_S,
    plan_every_s: float = PLAN_EVERY_S,
    retire_after_s: float = DEFAULT_RETIRE_AFTER_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SensorDefinition:
    """The sensor taking `turn` of `turns` at the inbox (turn 0: `new_leads`, which also hands over
    background work and runs the partition lifecycle); `wait_for_leads_s` is how long a tick with
    nothing to do waits for the inbox (0: return at once), `plan_every_s` how often `new_leads` plans
    its backlog again meanwhile, `retire_after_s` how long a lead no case holds keeps its partition
    once idle, `clock` and `sleep` time that wait."""
    primary = turn == 0
    if primary:
        description = (
            "Queues leads accepted by the webhook intake (one collection per wanted source) and hands each "
            "source's backlog to Dagster within its max_in_flight, interactive work first. A tick with nothing "
            f"to do waits up to {wait_for_leads_s:g} s for a lead of its turn, so a fresh lead is picked up "
            "within the inbox poll, not the daemon's 5 s sensor loop; meanwhile it plans the backlog again "
            f"every {plan_every_s:g} s."
        )
    else:
        description = (
            f"Relay of {NEW_LEAD_SENSOR}: waits up to {wait_for_leads_s:g} s per tick for the inbox rows of "
            f"turn {turn} of {turns} and hands their interactive collections to Dagster, so a second lead in "
            "one sensor loop is not left for the next loop. Stopping it only delays such leads to the next loop."
        )

    @sensor(name=sensor_name(turn), jobs=jobs, minimum_interval_seconds=INTERVAL_S,
            default_status=DefaultSensorStatus.RUNNING, description=description)
    def new_leads(context: SensorEvaluationContext, fleet: FleetResource) -> SensorResult | SkipReason:
        store = fleet.store
        deadline = clock() + wait_for_leads_s
        cursor, leads_since, lifecycle_at = read_cursor(context.cursor)
        read = queued = 0
        run_requests: list[RunRequest] = []
        reasons: list[str] = []
        order = partition_order_of(context.instance)
        if primary:
            sync_pool_limits(context.instance, catalog)
            lifecycle_at = run_lifecycle(context, store, last=lifecycle_at, retire_after_s=retire_after_s)
            awake = True
        else:
            # The inbox as it is now is new_leads' (its tick starts in the same loop, with a pass over
            # it): a relay only waits for the rows of its turn that arrive during its tick.
            cursor = store.last_inbox_id()
            awake = _wait_for_inbox(store, cursor, deadline, turn=turn, turns=turns, clock=clock, sleep=sleep)
        while awake:
            if primary:
                read_leads, leads_since = sync_lead_partitions(context.instance, store, since=leads_since)
                if read_leads:
                    order.cache_clear()
            cursor, items, added, more = ingest_inbox(context, store, catalog, cursor, clock=clock)
            read, queued = read + items, queued + added
            plan = plan_dispatch(store, catalog, max_runs=MAX_RUNS_PER_TICK, circuits=Circuits(store),
                                 order=lambda lead: order_from(order())(lead),
                                 background_runs=background_runs_of(context.instance), background=primary)
            run_requests, reasons = run_requests_for(store, context.instance, plan, order, catalog), plan.reasons
            # Nothing to hand over (another sensor took it, say): wait on, unless the inbox has more.
            if run_requests or more:
                break
            # new_leads plans again at PLAN_EVERY_S whether or not a lead came; a relay only for one.
            plan_by = min(deadline, clock() + plan_every_s) if primary else deadline
            awake = (_wait_for_inbox(store, cursor, plan_by, turn=turn, turns=turns, clock=clock, sleep=sleep)
                     or (primary and clock() < deadline))
        if run_requests:
            # Rows that arrived while this tick planned (the rest of a big case's deliveries) are
            # queued now, not a sensor loop later; they go out at the next tick.
            cursor, late, added, _ = ingest_inbox(context, store, catalog, cursor, clock=clock)
            read, queued = read + late, queued + added
        for reason in reasons:
            context.log.info(f"backpressure: {reason}")
        new_cursor = write_cursor(cursor, leads_since, lifecycle_at)
        if not run_requests:
            why = "; ".join(reasons) or "nothing ready in the backlog"
            return SensorResult(skip_reason=f"{read} inbox row(s) read, no run requested: {why}",
                                cursor=new_cursor)
        # A single run's lead may have joined the fleet during this tick (a relay does not sync).
        leads = sorted({request.partition_key for request in run_requests if request.partition_key})
        context.log.info(f"{read} inbox row(s), {queued} queued, {len(run_requests)} run(s) requested")
        return SensorResult(
            run_requests=run_requests,
            dynamic_partitions_requests=[leads_partitions.build_add_request(leads)] if leads else None,
            cursor=new_cursor,
        )

    return new_leads


def ingest_inbox(context: SensorEvaluationContext, store: StateStore, catalog: SourceCatalog, cursor: int, *,
                 clock: Callable[[], float]) -> tuple[int, int, int, bool]:
    """Queue the inbox after `cursor`, INBOX_CHUNK rows per transaction, for up to INGEST_BUDGET_S;
    return the new cursor, the rows read, the collections queued and whether rows are left."""
    read = added = 0
    deadline = clock() + INGEST_BUDGET_S
    while True:
        items = store.inbox_after(cursor, limit=INBOX_CHUNK)
        queued, notes = ingest(store, items, catalog)
        read, added = read + len(items), added + queued
        cursor = items[-1].id if items else cursor
        for note in notes:
            context.log.warning(note)
        if len(items) < INBOX_CHUNK:
            return cursor, read, added, False
        if clock() >= deadline:
            return cursor, read, added, True


def run_lifecycle(context: SensorEvaluationContext, store: StateStore, *, last: float,
                  retire_after_s: float) -> float:
    """A lifecycle pass over the `leads` partitions if the last one (epoch seconds) is a minute old;
    return when the latest pass ran."""
    now = time.time()
    if now - last < LIFECYCLE_EVERY_S:
        return last
    retired = revived = 0
    while True:
        changes = lifecycle_pass(context.instance, store, retire_after=timedelta(seconds=retire_after_s),
                                 batch=LIFECYCLE_BATCH)
        retired, revived = retired + len(changes.retired), revived + len(changes.revived)
        # A full pass leaves more behind (a big case closed, an upgrade): go on within the budget.
        full = LIFECYCLE_BATCH in (len(changes.retired), len(changes.revived))
        if not full or time.time() - now >= LIFECYCLE_BUDGET_S:
            break
    if retired or revived:
        context.log.info(f"lead partitions: {retired} retired, {revived} brought back"
                         + (" (more next tick)" if full else ""))
    return 0.0 if full else now


def has_turn(cursor: int, last: int, *, turn: int, turns: int) -> bool:
    """Whether the inbox rows after `cursor` up to `last` include one of `turn` (row id modulo `turns`)."""
    return any(row % turns == turn for row in range(cursor + 1, min(last, cursor + turns) + 1))


def _wait_for_inbox(
    store: StateStore, cursor: int, deadline: float, *, turn: int, turns: int,
    clock: Callable[[], float], sleep: Callable[[float], None],
) -> bool:
    """Poll the inbox until a row of this turn arrives after `cursor`, or a row of another turn has
    waited PICKUP_GRACE_S (True), or `deadline` passes (False). The sensor whose turn it is may have
    returned already (its tick handed over runs): then the lead is taken by whichever sensor still
    waits, instead of waiting for the daemon's next loop; a sensor that finds it taken waits on."""
    other_since: float | None = None
    while (left := deadline - clock()) > 0:
        sleep(min(INBOX_POLL_S, left))
        last = store.last_inbox_id()
        if has_turn(cursor, last, turn=turn, turns=turns):
            return True
        if last > cursor:
            other_since = clock() if other_since is None else other_since
            if clock() - other_since >= PICKUP_GRACE_S:
                return True
    return False
