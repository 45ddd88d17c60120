"""The new-lead sensor: inbox rows become queued collections; queued collections become runs.

Two steps per tick. Ingest: every inbox row after the cursor is queued once per wanted source in
the fleet's own backlog (`collection_queue`). Dispatch: each source hands Dagster at most
`max_in_flight` unfinished collections, highest priority first, and none while its circuit rests;
the rest waits in the backlog, in the database, not in the run queue.

A tick with nothing to do waits for the inbox instead of returning at once: the daemon starts a
sensor's tick at most once per loop (5 s), so a lead arriving just after an empty tick would wait
up to 5 s for the next one. Waiting inside the tick, and returning as soon as a lead arrives, turns
that into the poll interval.

A tick hands its runs over only when it returns, so one waiting sensor picks up one arrival per
loop at once and the next lead waits for the next loop. Several sensors therefore take turns at the
inbox (`PICKUP_TURNS`): each wakes for the inbox rows of its turn (row id modulo the turns), so
consecutive leads wake different sensors. `new_leads` (turn 0) also hands over background work and
keeps the pool limits; a relay (`new_leads_relay1`, ...) hands over interactive work only, so the
background bound is counted in one place. Two sensors that wake for the same lead (one webhook's
leads are consecutive rows) are safe: ingest is idempotent and dispatch claims each collection in
one transaction; the one that finds nothing left keeps waiting.
"""

import hashlib
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import cache
from typing import Any

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
from assets.naming import job_name
from assets.partitions import leads_partitions
from investigations.pacing import Circuits
from investigations.priority import BACKGROUND_TAG, BATCH_LEADS_TAG, PriorityClass, run_tags
from investigations.specs import SourceCatalog, SourceSpec
from investigations.store import InboxItem, QueuedCollection, StateStore, utcnow
from resources.fleet import FleetResource
from sensors.pools import sync_pool_limits

NEW_LEAD_SENSOR = "new_leads"
# Caps one tick's work: Dagster creates ~10 runs/s from one tick, and a tick has 60 s to finish.
MAX_INBOX_ROWS_PER_TICK = 200
MAX_RUNS_PER_TICK = 100
# The daemon evaluates sensors in a loop of at least 5 s. Asking for 5 s aliases to every other loop
# (10 s; measured: ticks 9.98 s apart at the median), because a loop starts a hair under 5 s after
# the last tick; asking for less gets every loop.
INTERVAL_S = 1
# An empty tick waits this long for the inbox, polling it every INBOX_POLL_S. It must end before the
# daemon's next loop (5 s after this tick's start, less the time the loop took to start it): a tick
# still running then is skipped, and the next one would start only 10 s after this one.
WAIT_FOR_LEADS_S = 3.5
INBOX_POLL_S = 0.2
# Sensors taking turns at the inbox: up to this many leads per loop are picked up within the poll.
PICKUP_TURNS = 2
# Background runs collect a batch of leads sized to about this much work at the source's rate.
BATCH_SECONDS = 90
# A run in these states holds, or will hold, a slot of its source's pool.
IN_FLIGHT_STATUSES = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
                      DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
# A dispatched collection whose run never reported back goes back to the queue after this long.
STALE_DISPATCH = timedelta(minutes=30)


def wanted_sources(item: InboxItem, catalog: SourceCatalog) -> tuple[list[str], list[str]]:
    """The sources an inbox row asks for, and the reasons for any wanted source that is skipped."""
    wanted = item.sources or [spec.name for spec in catalog.for_kind(item.lead.kind)]
    names, skipped = [], []
    for name in wanted:
        if name not in catalog.names:
            skipped.append(f"{name}: no longer in sources.yaml")
        elif not catalog.get(name).accepts(item.lead.kind):
            skipped.append(f"{name}: does not take {item.lead.kind} leads")
        else:
            names.append(name)
    return names, skipped


def ingest(store: StateStore, items: list[InboxItem], catalog: SourceCatalog) -> tuple[int, list[str]]:
    """Queue every inbox row once per wanted source (idempotent by inbox row)."""
    queued, notes = 0, []
    for item in items:
        names, skipped = wanted_sources(item, catalog)
        queued += store.enqueue(
            [(name, item.lead.id) for name in names],
            origin=f"inbox:{item.id}",
            priority_class=item.priority_class,
            case_id=item.case_id,
        )
        notes.extend(f"inbox row {item.id} lead {item.lead.id}: skipped {reason}" for reason in skipped)
    return queued, notes


def run_request_for(row: QueuedCollection) -> RunRequest:
    """The run of one queued collection. The run key names the queue row, so a re-evaluated tick or a
    re-dispatched row never starts a second run, while a new request for the lead gets its own."""
    tags = {
        **run_tags(PriorityClass(row.priority_class)),
        "investigations/source": row.source,
        "investigations/lead_id": row.lead_id,
        "investigations/origin": row.origin,
    }
    if row.case_id:
        tags["investigations/case_id"] = row.case_id
    return RunRequest(job_name=job_name(row.source), partition_key=row.lead_id,
                      run_key=f"{row.source}:{row.lead_id}:q{row.id}", tags=tags)


def batch_size(spec: SourceSpec) -> int:
    """Leads per background run: about BATCH_SECONDS of work at the source's permitted rate."""
    return max(1, min(spec.batch_max_leads, spec.max_in_flight, int(spec.rate.source_per_s * BATCH_SECONDS)))


def background_bound(spec: SourceSpec) -> int:
    """Background collections of a source handed to Dagster at once: `concurrency` whole batches,
    within `max_in_flight`."""
    return min(spec.max_in_flight, spec.concurrency * batch_size(spec))


def background_take(spec: SourceSpec, *, in_flight: int, ready: int, runs_in_flight: int = 0) -> int:
    """How many background collections to hand over now: whole batches only, or the whole backlog
    when it is smaller than a batch and fits, and never a run beyond `concurrency` background runs
    of the source (counted in Dagster: a batch near its end still holds a pool slot); the pool's
    `interactive_slots` above that stay for fresh leads (see `pools`). Handing over whatever room
    the last finished leads freed would start a trickle of small runs, each costing seconds of CPU
    to start."""
    size = batch_size(spec)
    room = min(background_bound(spec) - in_flight, (spec.concurrency - runs_in_flight) * size)
    if room >= size:
        return room // size * size
    return ready if 0 < ready <= room else 0


def batch_run_request(spec: SourceSpec, rows: list[QueuedCollection], order: Mapping[str, int]) -> RunRequest:
    """One run collecting many leads of one source: a partition range envelope (first..last lead in
    the `leads` partition order) and the member leads in a tag; only members are collected."""
    rows = sorted(rows, key=lambda row: order[row.lead_id])
    ids = sorted(row.id for row in rows)
    digest = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]
    return RunRequest(
        job_name=job_name(spec.name),
        run_key=f"{spec.name}:batch:{digest}",
        tags={
            **run_tags(PriorityClass(rows[0].priority_class)),
            "dagster/asset_partition_range_start": rows[0].lead_id,
            "dagster/asset_partition_range_end": rows[-1].lead_id,
            BATCH_LEADS_TAG: ",".join(row.lead_id for row in rows),
            "investigations/source": spec.name,
            "investigations/origin": rows[0].origin,
        },
    )


def run_requests_for(
    spec: SourceSpec, rows: list[QueuedCollection], order: Callable[[], Mapping[str, int]]
) -> list[RunRequest]:
    """Interactive rows run one lead each (latency first); background rows run in batches (a run
    costs seconds of overhead). A lead not yet in the partitions set runs alone."""
    requests = [run_request_for(row) for row in rows if row.priority_class == PriorityClass.INTERACTIVE]
    background = [row for row in rows if row.priority_class != PriorityClass.INTERACTIVE]
    if not background:
        return requests
    index = order()
    by_class: dict[str, list[QueuedCollection]] = {}
    for row in background:
        if row.lead_id in index:
            by_class.setdefault(row.priority_class, []).append(row)
        else:
            requests.append(run_request_for(row))
    size = batch_size(spec)
    for members in by_class.values():
        members.sort(key=lambda row: index[row.lead_id])
        for chunk in (members[i:i + size] for i in range(0, len(members), size)):
            # A batch of one is an ordinary run, with the lead in its tags like any other.
            requests.append(batch_run_request(spec, chunk, index) if len(chunk) > 1 else run_request_for(chunk[0]))
    return requests


def circuit_room(circuits: Circuits, source: str, *, now_s: float) -> tuple[int | None, str | None]:
    """How many collections a source's circuit lets out now (None: no limit), and why if fewer.

    A resting source gets nothing, so its work waits in the backlog without holding a run slot;
    once the rest is over it gets one collection: the probe.
    """
    state = circuits.state(source)
    if state is None or state.state == "closed":
        return None, None
    if state.state == "open" and state.probe_at_s is not None and now_s < state.probe_at_s:
        return 0, f"{source}: circuit open after {state.failure_streak} failures; probe in {state.probe_at_s - now_s:.0f} s"
    if state.state == "half_open":
        return 0, f"{source}: circuit half open, waiting for its probe"
    return 1, f"{source}: circuit open, sending one probe"


def dispatch(
    store: StateStore,
    catalog: SourceCatalog,
    *,
    max_runs: int,
    circuits: Circuits | None = None,
    now: datetime | None = None,
    partition_order: Callable[[], Mapping[str, int]] = dict,
    background_runs: Callable[[str], int] = lambda _source: 0,
    background: bool = True,
) -> tuple[list[RunRequest], list[str]]:
    """Hand each source's ready collections to Dagster within its backpressure bound and circuit;
    `background_runs(source)` counts the source's background runs not finished yet. With
    `background` False only interactive work is handed over (a relay's dispatch)."""
    now = now or utcnow()
    store.release_stale_dispatches(older_than=now - STALE_DISPATCH)
    depths = store.queue_depths(now=now)
    requests: list[RunRequest] = []
    reasons: list[str] = []
    for spec in catalog.sources:
        depth = depths.get(spec.name)
        if not depth or not (depth["ready"] if background else depth["ready_interactive"]):
            continue
        allowed = None
        if circuits is not None:
            allowed, why = circuit_room(circuits, spec.name, now_s=now.timestamp())
            if why:
                reasons.append(why)
            if allowed == 0:
                continue
        if allowed is not None:  # a probe: one collection at a time, whatever its class
            limit = min(allowed - depth["dispatched"], 1, max_runs - len(requests))
            probe = store.dispatch(spec.name, limit=limit, now=now,
                                   classes=None if background else [PriorityClass.INTERACTIVE.value])
            requests.extend(run_requests_for(spec, probe, partition_order))
            continue
        # Interactive work and background work are bounded apart, so a full background backlog
        # never holds a fresh lead back.
        interactive_room = spec.max_in_flight - depth["dispatched_interactive"]
        background_in_flight = depth["dispatched"] - depth["dispatched_interactive"]
        background_ready = depth["ready"] - depth["ready_interactive"] if background else 0
        runs_in_flight = background_runs(spec.name) if background_ready else 0
        background_room = background_take(spec, in_flight=background_in_flight, ready=background_ready,
                                          runs_in_flight=runs_in_flight)
        rows = store.dispatch(spec.name, limit=min(interactive_room, max_runs - len(requests)), now=now,
                              classes=[PriorityClass.INTERACTIVE.value])
        if depth["ready_interactive"] > len(rows):
            reasons.append(
                f"{spec.name}: {depth['dispatched_interactive'] + len(rows)} interactive collections in flight "
                f"(max_in_flight {spec.max_in_flight}); {depth['ready_interactive'] - len(rows)} wait in the backlog"
            )
        runs_left = max_runs - len(requests) - len(rows)
        background_room = min(background_room, runs_left * batch_size(spec))
        handed: list[QueuedCollection] = []
        if background_ready and background_room > 0:
            handed = store.dispatch(spec.name, limit=background_room, now=now,
                                        classes=[PriorityClass.RECURRING.value, PriorityClass.BACKFILL.value])
        if background_ready > len(handed):
            reasons.append(
                f"{spec.name}: {background_in_flight + len(handed)} background collections in flight in "
                f"{runs_in_flight} run(s) and {len(handed)} more handed over (at most {spec.concurrency} "
                f"batch(es) of {batch_size(spec)}); {background_ready - len(handed)} wait in the backlog"
            )
        requests.extend(run_requests_for(spec, rows + handed, partition_order))
    return requests, reasons


def partition_order_of(instance: DagsterInstance) -> Callable[[], Mapping[str, int]]:
    """The position of every lead in the `leads` partitions, read once per tick and only if needed."""

    @cache
    def order() -> Mapping[str, int]:
        keys = instance.get_dynamic_partitions(leads_partitions.name)
        return {key: position for position, key in enumerate(keys)}

    return order


def background_runs_of(instance: DagsterInstance) -> Callable[[str], int]:
    """Counts a source's background runs that are queued or running, from Dagster's run records."""

    def count(source: str) -> int:
        return instance.get_runs_count(RunsFilter(job_name=job_name(source), statuses=IN_FLIGHT_STATUSES,
                                                  tags={BACKGROUND_TAG: "true"}))

    return count


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
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SensorDefinition:
    """The sensor taking `turn` of `turns` at the inbox (turn 0: `new_leads`, which also hands over
    background work); `wait_for_leads_s` is how long a tick with nothing to do waits for the inbox
    (0: return at once), `clock` and `sleep` time that wait."""
    primary = turn == 0
    if primary:
        description = (
            "Queues leads accepted by the webhook intake (one collection per wanted source) and hands each "
            "source's backlog to Dagster within its max_in_flight, interactive work first. A tick with nothing "
            f"to do waits up to {wait_for_leads_s:g} s for a lead of its turn, so a fresh lead is picked up "
            "within the inbox poll, not the daemon's 5 s sensor loop."
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
        read = queued = 0
        run_requests: list[RunRequest] = []
        reasons: list[str] = []
        if primary:
            sync_pool_limits(context.instance, catalog)
            cursor = int(context.cursor or 0)
            awake = True
        else:
            # The inbox as it is now is new_leads' (its tick starts in the same loop, with a pass over
            # it): a relay only waits for the rows of its turn that arrive during its tick.
            cursor = store.last_inbox_id()
            awake = _wait_for_inbox(store, cursor, deadline, turn=turn, turns=turns, clock=clock, sleep=sleep)
        while awake:
            items = store.inbox_after(cursor, limit=MAX_INBOX_ROWS_PER_TICK)
            added, notes = ingest(store, items, catalog)
            read, queued = read + len(items), queued + added
            cursor = items[-1].id if items else cursor
            for note in notes:
                context.log.warning(note)
            run_requests, reasons = dispatch(store, catalog, max_runs=MAX_RUNS_PER_TICK, circuits=Circuits(store),
                                             partition_order=partition_order_of(context.instance),
                                             background_runs=background_runs_of(context.instance),
                                             background=primary)
            # Nothing to hand over (another sensor took it, say): wait on, unless the inbox has more.
            if run_requests or len(items) == MAX_INBOX_ROWS_PER_TICK:
                break
            awake = _wait_for_inbox(store, cursor, deadline, turn=turn, turns=turns, clock=clock, sleep=sleep)
        for reason in reasons:
            context.log.info(f"backpressure: {reason}")
        new_cursor = str(cursor)
        if not run_requests:
            why = "; ".join(reasons) or "nothing ready in the backlog"
            return SensorResult(skip_reason=f"{read} inbox row(s) read, no run requested: {why}",
                                cursor=new_cursor)
        # Batch runs name leads that are partitions already; single runs may bring a new lead.
        leads = sorted({request.partition_key for request in run_requests if request.partition_key})
        context.log.info(f"{read} inbox row(s), {queued} queued, {len(run_requests)} run(s) requested")
        return SensorResult(
            run_requests=run_requests,
            dynamic_partitions_requests=[leads_partitions.build_add_request(leads)] if leads else None,
            cursor=new_cursor,
        )

    return new_leads


def has_turn(cursor: int, last: int, *, turn: int, turns: int) -> bool:
    """Whether the inbox rows after `cursor` up to `last` include one of `turn` (row id modulo `turns`)."""
    return any(row % turns == turn for row in range(cursor + 1, min(last, cursor + turns) + 1))


def _wait_for_inbox(
    store: StateStore, cursor: int, deadline: float, *, turn: int, turns: int,
    clock: Callable[[], float], sleep: Callable[[float], None],
) -> bool:
    """Poll the inbox until a row of this turn arrives after `cursor` (True) or `deadline` passes (False)."""
    while (left := deadline - clock()) > 0:
        sleep(min(INBOX_POLL_S, left))
        if has_turn(cursor, store.last_inbox_id(), turn=turn, turns=turns):
            return True
    return False
