"""The dispatcher: which queued collections each source hands to Dagster now, and why the rest waits.

Every wanted collection lives in the fleet's backlog (`collection_queue`); Dagster only ever holds a
bounded amount of it. One pass decides, per source and in this order:

1. the circuit: a resting source hands over nothing, and after its rest one collection, the probe;
   the budget: a source whose spend today reached its `daily_budget_usd` hands over no background
   work (see `investigations.scheduling.cost`), interactive work still goes;
2. interactive work: everything ready goes out at once (an investigator is waiting), within the
   source's `max_in_flight`, bounded apart from background work so a full background backlog never
   holds a fresh lead back. A case's leads for one source go out together, in runs sized by the same
   rate-and-time rule as background batches (`batch_size`): a run costs seconds of CPU to start, so
   one run per lead ran a 300-lead case at 0.015 of its source's speed. A few fresh leads (at most
   the source's `concurrency`) join an interactive run of their source that is still open to them
   (`join_collectors`, `investigations.collection.runwork`) instead of starting one; else a lone fresh lead is
   a run of its own;
3. background work (recurring crawls, backfills): whole batches only, at most the source's
   background runs at once (`background_runs_for`, derived from its rate), within `max_in_flight`.
   A run costs seconds of CPU to start, so handing over whatever room the last finished leads freed
   would start a trickle of small runs.

The answer is plain values (`Handover`s and reasons); the Dagster layer turns them into run requests.
Nothing here knows Dagster's tag names.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from investigations.collection.runwork import LINGER_S, OPEN_FOR_S
from investigations.fleet.degradation import CanaryState, canary_answer_fails, canary_states, follow_canaries
from investigations.identities.leasing import longest_hold_s
from investigations.pacing import Circuits, jittered_start_s
from investigations.scheduling.cadence import (
    RevisitPlan,
    SourcePlan,
    change_rate,
    duration,
    estimate_rates,
    plan_source,
    planned_interval_s,
    prior_rate_per_s,
    why,
)
from investigations.scheduling.cost import over_budget, spend_today
from investigations.scheduling.priority import PriorityClass
from investigations.sources.specs import SourceCatalog, SourceSpec
from investigations.store import (
    DIED_COLLECTING,
    RUN_DIED,
    InboxItem,
    QueuedCollection,
    QueueEntry,
    SourceIncident,
    StateStore,
    utcnow,
)

# A background run collects about this much work at the source's permitted rate: long enough that a
# run's start (seconds of CPU) is small beside it, short enough that a fresh lead's batch-mates and a
# terminated run lose little. The UI's backfills are chunked by the same rule.
BATCH_SECONDS = 90
# How long a background run takes to start (launch, imports, resources) and to wind down its last
# leads on a busy 2-core machine, during which other runs of the source must keep its lanes busy.
RUN_OVERLAP_S = 15
# A dispatched collection whose run never reported back goes back to the queue after this long (a
# run that died is noticed much sooner, from Dagster's run records: see `release_dead_run`).
STALE_DISPATCH = timedelta(minutes=30)
# A dispatched row whose handover has no run this long after it was claimed was lost between the
# sensor's claim and the run's creation (the daemon or the code server died during the tick, whose
# evaluation may last 60 s): it goes back to the queue, no run death counted.
ORPHANED_DISPATCH = timedelta(minutes=2)
# A collection whose runs died this many times without collecting it becomes a dead letter
# (`crashed`): a lead that kills its run worker must not loop forever.
MAX_RUN_DEATHS = 3
# The longest one collection can take: every attempt timing out after the longest backoff, a
# throttled wait up to parking, waiting for an identity; plus this margin.
RUNTIME_MARGIN_S = 300.0
BACKGROUND_CLASSES = (PriorityClass.RECURRING.value, PriorityClass.BACKFILL.value)


@dataclass(frozen=True)
class Handover:
    """One run to request: one lead, or a batch of one source's leads of one class (and, for
    interactive work, of one case). With `joins`, no run of its own: the rows go to the open run
    of that handover key (see `join_collectors`)."""

    source: str
    priority_class: PriorityClass
    rows: tuple[QueuedCollection, ...]
    joins: str | None = None

    @property
    def lead_ids(self) -> list[str]:
        return [row.lead_id for row in self.rows]

    @property
    def is_batch(self) -> bool:
        return len(self.rows) > 1

    @property
    def case_id(self) -> str | None:
        """The case every row was queued for, or None when they name none or several."""
        cases = {row.case_id for row in self.rows}
        return cases.pop() if len(cases) == 1 else None

    @property
    def key(self) -> str:
        """A key unique to this handover of these queue rows. A row handed over again (its run died,
        its dispatch went stale) was dispatched at another moment, so it gets a new key: a run key
        Dagster has seen is never started again. Rows that join an open run take its key."""
        if self.joins is not None:
            return self.joins
        if not self.is_batch:
            row = self.rows[0]
            return f"{self.source}:{row.lead_id}:q{row.id}:d{_stamp(row)}"
        ids = ",".join(f"{row.id}:{_stamp(row)}" for row in sorted(self.rows, key=lambda row: row.id))
        return f"{self.source}:batch:{hashlib.sha256(ids.encode()).hexdigest()[:12]}"


@dataclass
class DispatchPlan:
    """What one dispatch pass hands over, and why anything ready was held back."""

    handovers: list[Handover] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    @property
    def lead_ids(self) -> list[str]:
        """Every lead the handovers collect, each once, in handover order."""
        return list(dict.fromkeys(lead for handover in self.handovers for lead in handover.lead_ids))


@dataclass(frozen=True)
class CircuitGate:
    """What a source's circuit lets out now: `room` None is no limit, 0 nothing, 1 the probe."""

    room: int | None
    reason: str | None = None
    state: str = "closed"

    @property
    def closed(self) -> bool:
        return self.room is None


def circuit_gate(circuits: Circuits | None, source: str, *, now_s: float) -> CircuitGate:
    """The one circuit rule every caller (dispatch, recurring planning) uses.

    A resting source gets nothing, so its work waits in the backlog without holding a run slot;
    once the rest is over it gets one collection: the probe.
    """
    state = circuits.state(source) if circuits is not None else None
    if state is None or state.state == "closed":
        return CircuitGate(None)
    if state.state == "open" and state.probe_at_s is not None and now_s < state.probe_at_s:
        return CircuitGate(0, f"{source}: circuit open after {state.failure_streak} failures; "
                              f"probe in {state.probe_at_s - now_s:.0f} s", state.state)
    if state.state == "half_open":
        return CircuitGate(0, f"{source}: circuit half open, waiting for its probe", state.state)
    return CircuitGate(1, f"{source}: circuit open, sending one probe", state.state)


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


def ingest(store: StateStore, items: Sequence[InboxItem], catalog: SourceCatalog) -> tuple[int, list[str]]:
    """Queue every inbox row once per wanted source (idempotent by inbox row), all in one transaction:
    a case of hundreds of leads is queued at once, so its leads go out together."""
    entries, notes = list[QueueEntry](), list[str]()
    for item in items:
        names, skipped = wanted_sources(item, catalog)
        entries.extend(QueueEntry(name, item.lead.id, f"inbox:{item.id}", item.priority_class, item.case_id)
                       for name in names)
        notes.extend(f"inbox row {item.id} lead {item.lead.id}: skipped {reason}" for reason in skipped)
    return store.enqueue_each(entries), notes


def batch_size(spec: SourceSpec) -> int:
    """Leads per background run: about BATCH_SECONDS of work at the source's permitted rate."""
    return max(1, min(spec.batch_max_leads, int(spec.rate.source_per_s * BATCH_SECONDS)))


def background_runs_for(spec: SourceSpec) -> int:
    """How many background runs of a source may be queued or running at once: derived from its rate.

    One run keeps `concurrency` collections in flight and, at the source's rate, finishes its batch
    in `batch_size / source_per_s` seconds. A run also takes RUN_OVERLAP_S to start and to wind down
    its last leads, while the source's lanes would sit idle; so enough other runs must be under way
    to keep the lanes busy meanwhile: 1 + ceil(RUN_OVERLAP_S / batch seconds). A slow source (a
    90 s batch) gets 2, a fast one whose batch is capped by `batch_max_leads` more. A fixed number
    for every source would starve a fast one or flood a slow one.
    """
    return 1 + math.ceil(RUN_OVERLAP_S * spec.rate.source_per_s / batch_size(spec))


def background_bound(spec: SourceSpec) -> int:
    """Background collections of a source handed to Dagster at once: its background runs' whole
    batches (backpressure sized by the rate: at most a couple of batches' work waits in Dagster)."""
    return background_runs_for(spec) * batch_size(spec)


def overlap_leads(spec: SourceSpec) -> int:
    """The source's work of RUN_OVERLAP_S at its permitted rate: what a run still has to do when
    the next one should be handed over, so that one starts about as this one winds down."""
    return math.ceil(RUN_OVERLAP_S * spec.rate.source_per_s)


def background_take(spec: SourceSpec, *, in_flight: int, ready: int, runs_in_flight: int = 0) -> int:
    """How many background collections may be handed over now: whole batches' worth (a backlog
    smaller than that goes out whole), and never a run beyond the source's background runs
    (counted in Dagster: a batch near its end still holds a pool slot). 0 when nothing is ready.

    Staggered: a batch goes out only while the work in flight before it is at most the source's
    `overlap_leads`, so a backfill starts one run and the next joins as the first winds down, rather
    than two runs at once splitting the same lanes and identities for the whole batch (each with
    its own threads asking for them). As `background_runs_for` leaves room for the batches the
    overlap needs, a take is never less than a batch: finished leads never start small runs.
    """
    size = batch_size(spec)
    overlap = overlap_leads(spec)
    if not ready or in_flight > overlap:
        return 0
    room = min(background_bound(spec) - in_flight, (background_runs_for(spec) - runs_in_flight) * size,
               ((overlap - in_flight) // size + 1) * size)
    return max(0, room // size * size)


def batches(spec: SourceSpec, rows: Sequence[QueuedCollection], order: Callable[[str], int]) -> list[Handover]:
    """Rows in runs of at most `batch_size`: interactive rows per case, first (in queue order, so a
    case's leads go out as it sent them); background rows per class, in `order` (the caller's order
    of leads, so a batch spans few others); a row whose last run died, alone. A batch of one is a
    single."""
    groups: dict[tuple[str, str | None], list[QueuedCollection]] = {}
    alone: list[QueuedCollection] = []
    for row in rows:
        if row.outcome == DIED_COLLECTING:
            # Its last run died while collecting it: it may be what kills a worker, so it goes alone.
            alone.append(row)
            continue
        interactive = row.priority_class == PriorityClass.INTERACTIVE
        groups.setdefault((row.priority_class, row.case_id if interactive else None), []).append(row)
    size = batch_size(spec)
    handovers = [Handover(spec.name, PriorityClass(row.priority_class), (row,)) for row in alone]
    for (priority_class, _case), members in groups.items():
        if priority_class == PriorityClass.INTERACTIVE:
            members.sort(key=lambda row: row.id)
        else:
            members.sort(key=lambda row: order(row.lead_id))
        for start in range(0, len(members), size):
            handovers.append(Handover(spec.name, PriorityClass(priority_class), tuple(members[start:start + size])))
    # Interactive first: an investigator is waiting on them (`sorted` keeps the order within each).
    return sorted(handovers, key=lambda handover: handover.priority_class != PriorityClass.INTERACTIVE)


def join_collectors(spec: SourceSpec, handovers: Sequence[Handover], open_runs: Sequence[tuple[str, int]]
                    ) -> list[Handover]:
    """Interactive handovers that join a run of the source already open to fresh leads instead of
    starting one: a run costs seconds of CPU and of waiting to start, while an open run takes a
    joined lead at its next look at its handover (a fraction of a second).

    `open_runs` are the source's open runs with what each still owes. A handover joins when it is
    small, at most `concurrency` leads (a case worth more is a run of its own, tagged with its
    case), when its lead's last run did not die while collecting it (a suspect stays alone), and
    when the least loaded open run then owes at most `batch_size` (about 90 s of the source's work).
    """
    load = dict(open_runs)
    joined: list[Handover] = []
    for handover in handovers:
        small = handover.priority_class == PriorityClass.INTERACTIVE and len(handover.rows) <= spec.concurrency
        suspect = any(row.outcome == DIED_COLLECTING for row in handover.rows)
        key = min(load, key=lambda k: load[k], default=None)
        if small and not suspect and key is not None and load[key] + len(handover.rows) <= batch_size(spec):
            load[key] += len(handover.rows)
            handover = Handover(handover.source, handover.priority_class, handover.rows, joins=key)
        joined.append(handover)
    return joined


def plan_dispatch(
    store: StateStore,
    catalog: SourceCatalog,
    *,
    max_runs: int,
    circuits: Circuits | None = None,
    now: datetime | None = None,
    order: Callable[[str], int] = lambda _lead: 0,
    background_runs: Callable[[str], int] = lambda _source: 0,
    background: bool = True,
) -> DispatchPlan:
    """Claim each source's ready collections within its bounds and circuit, and say how they go out.

    `background_runs(source)` counts the source's background runs not finished yet (the caller reads
    them from Dagster's run records); `order` orders leads for batching. With `background` False only
    interactive work is handed over (a relay's pass). At most `max_runs` handovers.
    """
    now = now or utcnow()
    store.release_stale_dispatches(older_than=now - STALE_DISPATCH)
    depths = store.queue_depths(now=now)
    plan = DispatchPlan()
    budget = _BudgetGate(store, catalog, now=now)
    open_runs = store.open_collectors(now_s=now.timestamp()) if any(
        depth["ready_interactive"] for depth in depths.values()) else {}
    for spec in catalog.sources:
        depth = depths.get(spec.name)
        if not depth or not (depth["ready"] if background else depth["ready_interactive"]):
            continue
        background_ready = depth["ready"] - depth["ready_interactive"] if background else 0
        if background_ready and (held := budget.reason(spec)):
            plan.reasons.append(f"{spec.name}: {held}; {background_ready} background collections wait in the backlog")
            background_ready = 0
            if not depth["ready_interactive"]:
                continue
        gate = circuit_gate(circuits, spec.name, now_s=now.timestamp())
        if gate.reason:
            plan.reasons.append(gate.reason)
        if gate.room == 0:
            continue
        runs_left = max_runs - len(plan.handovers)
        if gate.room is not None:  # the probe: one collection at a time, whatever its class
            limit = min(gate.room - depth["dispatched"], 1, runs_left)
            probe = store.dispatch(spec.name, limit=limit, now=now,
                                   classes=None if background_ready else [PriorityClass.INTERACTIVE.value])
            plan.handovers.extend(batches(spec, probe, order))
            continue
        rows = store.dispatch(spec.name, limit=min(spec.max_in_flight - depth["dispatched_interactive"],
                                                   runs_left * batch_size(spec)),
                              now=now, classes=[PriorityClass.INTERACTIVE.value])
        if depth["ready_interactive"] > len(rows):
            plan.reasons.append(
                f"{spec.name}: {depth['dispatched_interactive'] + len(rows)} interactive collections in flight "
                f"(max_in_flight {spec.max_in_flight}); {depth['ready_interactive'] - len(rows)} wait in the backlog"
            )
        interactive = join_collectors(spec, batches(spec, rows, order), open_runs.get(spec.name, []))
        plan.handovers.extend(interactive)
        if background_ready:
            in_flight = depth["dispatched"] - depth["dispatched_interactive"]
            runs_in_flight = background_runs(spec.name)
            room = background_take(spec, in_flight=in_flight, ready=background_ready, runs_in_flight=runs_in_flight)
            room = min(room, (runs_left - len(interactive)) * batch_size(spec))
            handed = store.dispatch(spec.name, limit=room, now=now, classes=list(BACKGROUND_CLASSES))
            if background_ready > len(handed):
                plan.reasons.append(
                    f"{spec.name}: {in_flight + len(handed)} background collections in flight in "
                    f"{runs_in_flight} run(s) and {len(handed)} more handed over (at most "
                    f"{background_runs_for(spec)} batch(es) of {batch_size(spec)}, the next once at most "
                    f"{overlap_leads(spec)} are left in flight); {background_ready - len(handed)} wait in the backlog"
                )
            plan.handovers.extend(batches(spec, handed, order))
    return plan


class _BudgetGate:
    """The budget rule for one planning pass: today's spend is read once, and only when a source
    with a budget has background work to judge (most passes have none)."""

    def __init__(self, store: StateStore, catalog: SourceCatalog, *, now: datetime) -> None:
        self._store, self._catalog, self._now = store, catalog, now
        self._spent: dict[str, float] | None = None

    def reason(self, spec: SourceSpec) -> str | None:
        """Why `spec` gets no background work now (its budget is spent), or None."""
        if spec.daily_budget_usd <= 0:
            return None
        if self._spent is None:
            self._spent = spend_today(self._store, self._catalog, now=self._now)
        return over_budget(spec, self._spent.get(spec.name, 0.0))


# Leads queued per source per tick; the rest are picked up on the next ticks, stalest first.
MAX_DUE_PER_SOURCE = 500
# A source whose backlog holds this many times its max_in_flight is not given more recurring work.
BACKLOG_FACTOR = 5
# Start times spread over this share of the window (at most MAX_SPREAD_S), so crawls of many leads
# and sources do not all start on the same tick.
START_SPREAD = 0.1
MAX_SPREAD_S = 600.0
# A canary whose own answer failed (no records, or an error) is collected again this long after it,
# not a cadence later (never later than the cadence): a source that answers again is noticed within
# minutes, as the source-level checks look every 5 minutes. One request of the source's every 5
# minutes while it fails (288 a day at most per canary, within its budget and circuit like all
# recurring work), against a rate of several a second.
CANARY_RETRY_S = 300.0


@dataclass(frozen=True)
class RecurringPlan:
    source: str
    window: int
    due: int
    queued: int
    skipped: str | None = None
    canaries: int = 0  # canary leads queued for this window
    recovered: int = 0  # leads queued again after its canaries passed again (`requeue_recovered`)
    failing_since: datetime | None = None  # its canary incident's first failing collection, while open
    # A learned cadence (`recrawl: {min, max}`): its leads' median planned interval, and whether its
    # budget was short of keeping every lead within `max` (see `investigations.scheduling.cadence`).
    median_interval_s: float | None = None
    budget_short: bool = False


def window_of(spec: SourceSpec, now: datetime) -> int:
    """The cadence window `now` falls in (windows of the source's shortest interval, `recrawl.min`:
    a lead is due at most once in one): queue origins (and so run keys) are unique per window."""
    return int(now.timestamp() // spec.recrawl.min_s)


def due_leads(store: StateStore, spec: SourceSpec, *, now: datetime) -> tuple[list[str], RevisitPlan | None]:
    """The leads `spec` monitors that are due a recurring crawl now, stalest first (at most
    MAX_DUE_PER_SOURCE), not those waiting or running for it, and the plan they come from.

    A fixed cadence (`recrawl_every`, or min = max) is read straight from the store: every lead
    whose last success is a cadence old. A learned one weighs every monitored lead's rate of change
    (`cadence.change_rate` from its visits, its source's prior for a new lead) within the source's
    budget and bounds (`cadence.plan_revisits`), and takes those whose planned visit has come,
    earliest first."""
    if spec.recrawl.is_fixed and spec.recrawl.closed_weight == 0:
        older_than = now - timedelta(seconds=spec.recrawl.min_s)
        return store.stale_monitored(spec.name, lead_kinds=spec.lead_kinds, older_than=older_than,
                                     limit=MAX_DUE_PER_SOURCE), None
    plan = plan_cadence(store, spec, now=now)
    return plan.due[:MAX_DUE_PER_SOURCE], plan


def plan_cadence(store: StateStore, spec: SourceSpec, *, now: datetime) -> RevisitPlan:
    """The source's learned recurring plan now (`cadence.plan_source`) over every lead it monitors
    (`StateStore.cadence_leads`). A lead's rate is the one estimated at its last visit; one kept for
    another prior (`recrawl.every` changed since) is estimated again from its visits, and kept."""
    prior_s = spec.recrawl.prior_s
    leads = store.cadence_leads(spec.name, lead_kinds=spec.lead_kinds, prior_s=prior_s,
                                closed_too=spec.recrawl.closed_weight > 0)
    leads, estimated = estimate_rates(leads, prior_rate_per_s(spec))
    store.keep_change_rates(spec.name, estimated, prior_s=prior_s)
    plan = plan_source(spec, leads, now_s=now.timestamp())
    if leads:
        # Kept for each lead's next visit as it is stored (`next_visit`): one row a source and pass.
        # A plan over no leads is not: its scale (0, the budget pays for every lead at `min`) says
        # nothing of the first leads' intervals, which would all read `min` until the next pass.
        store.keep_cadence_plan(spec.name, SourcePlan(plan.scale, plan.short), now=now)
    return plan


@dataclass(frozen=True)
class LeadCadenceView:
    """How a source looks at one lead, as operators see it: its estimated changes a day, how
    often it is collected, when next, and why."""

    changes_per_day: float
    interval_s: float
    next_due: datetime | None  # None: not collected again
    why: str


def lead_cadences(store: StateStore, spec: SourceSpec, *, now: datetime) -> dict[str, LeadCadenceView]:
    """Every lead `spec` monitors, by lead id: its cadence as the planner sees it now (read only: a
    rate not kept for the current prior is estimated, not written back)."""
    leads = store.cadence_leads(spec.name, lead_kinds=spec.lead_kinds, prior_s=spec.recrawl.prior_s,
                                closed_too=spec.recrawl.closed_weight > 0)
    filled, _ = estimate_rates(leads, prior_rate_per_s(spec))
    plan = plan_source(spec, filled, now_s=now.timestamp())
    views = {}
    for lead in filled:
        interval = plan.by_lead.get(lead.lead_id, math.inf)
        due = None if interval == math.inf else datetime.fromtimestamp(lead.last_at_s + interval, now.tzinfo)
        views[lead.lead_id] = LeadCadenceView(
            (lead.rate_per_s or 0.0) * 86_400, interval, due,
            why(spec, rate_per_s=lead.rate_per_s or 0.0, interval_s=interval, open_case=lead.open_case,
                short=plan.short))
    return views


def next_visit(store: StateStore, spec: SourceSpec, lead_id: str) -> LeadCadenceView | None:
    """When `spec` looks at a lead it collected again, and why, worked out for that lead alone (a
    materialization asks this of every lead a batch run stores, up to about a thousand: planning
    every lead the source monitors for each would be quadratic). None for a lead it never collected.

    The lead's rate is its own now (kept at its last visit, else estimated from its visits), its
    weight from its cases now; the budget's split is its source's last plan (`cadence_plans`, kept
    by the recurring planner each pass): `cadence.planned_interval_s`. So the figure may lag: it is
    the plan as of the last planning tick, whose scale moves as other leads' rates are estimated
    again and leads join or leave cases, and a learned source not planned yet is read as if its
    leads all changed at its prior (the text says so). A canary is collected on its own rule
    (`canary_interval_s`); a dead letter, or a lead no case holds, is not collected again."""
    known = store.planned_lead(spec.name, lead_id, prior_s=spec.recrawl.prior_s)
    if known is None:
        return None
    lead = known.lead
    rate = lead.rate_per_s if lead.rate_per_s is not None else change_rate(lead.visits, prior_rate_per_s(spec))
    canaries = {canary.lead.id for canary in spec.canaries}
    if lead_id in canaries:
        interval = canary_interval_s(spec, CanaryState(lead_id, known.outcome, known.records))
        text = f"a canary of the source: every {duration(spec.recrawl.prior_s)}"
        if interval < spec.recrawl.prior_s:
            text = f"a canary whose answer failed: again in {duration(interval)}"
    elif known.dead_letter:
        interval, text = math.inf, "not collected again: a dead letter of the source (a human requeues it)"
    elif not known.in_case:
        interval, text = math.inf, "not collected again: no case holds it"
    else:
        interval = planned_interval_s(spec, rate_per_s=rate, open_case=lead.open_case, plan=known.plan)
        short = known.plan is not None and known.plan.short
        text = why(spec, rate_per_s=rate, interval_s=interval, open_case=lead.open_case, short=short)
        if known.plan is None and not spec.recrawl.is_fixed and interval != math.inf:
            text += " (the source is not planned yet: as if every lead changed at its prior)"
    due = None if interval == math.inf else datetime.fromtimestamp(lead.last_at_s + interval, UTC)
    return LeadCadenceView(rate * 86_400, interval, due, text)


def plan_recurring(
    store: StateStore, catalog: SourceCatalog, *, now: datetime | None = None, circuits: Circuits | None = None
) -> list[RecurringPlan]:
    """Queue every source's due monitored leads for this window; return what was done and skipped."""
    now = now or utcnow()
    depths = store.queue_depths(now=now)
    budget = _BudgetGate(store, catalog, now=now)
    plans = []
    for spec in catalog.sources:
        window = window_of(spec, now)
        # The canaries are followed whatever holds the source's work back, so no failure or recovery
        # goes unrecorded; what they call for is queued within its circuit, budget and backlog.
        states = canary_states(store, spec)
        incident = follow_incident(store, spec, states)
        failing_since = incident.started_at if incident is not None and incident.open else None
        # Seeded by source and window: re-evaluating a tick draws the same start, nothing moves.
        rng = random.Random(f"{spec.name}:{window}")
        start = now + timedelta(seconds=jittered_start_s(min(spec.recrawl.min_s, MAX_SPREAD_S / START_SPREAD),
                                                         rng=rng, spread=START_SPREAD))
        gate = circuit_gate(circuits, spec.name, now_s=now.timestamp())
        if not gate.closed:
            # No recurring work for a resting source; but its due canaries wait in the backlog (within
            # its budget), where the dispatcher sends one as the circuit's probe: a source that answers
            # again is noticed at the end of its rest, not when a fresh lead happens to come.
            canaries = 0 if budget.reason(spec) else queue_canaries(store, spec, window=window, not_before=start,
                                                                      now=now, states=states)
            plans.append(RecurringPlan(spec.name, window, 0, 0, f"circuit {gate.state}", canaries=canaries,
                                       failing_since=failing_since))
            continue
        if held := budget.reason(spec):
            plans.append(RecurringPlan(spec.name, window, 0, 0, held, failing_since=failing_since))
            continue
        depth = depths.get(spec.name, {})
        backlog = sum(depth.values())
        if backlog >= BACKLOG_FACTOR * spec.max_in_flight:
            plans.append(RecurringPlan(spec.name, window, 0, 0, f"backlog full ({backlog} collections waiting)",
                                       failing_since=failing_since))
            continue
        due, cadence = due_leads(store, spec, now=now)
        queued = store.enqueue([(spec.name, lead) for lead in due], origin=f"recurring:{window}",
                               priority_class=PriorityClass.RECURRING.value, not_before=start, now=now)
        canaries = queue_canaries(store, spec, window=window, not_before=start, now=now, states=states)
        recovered = requeue_recovered(store, spec, incident, now=now)
        plans.append(RecurringPlan(spec.name, window, len(due), queued, canaries=canaries, recovered=recovered,
                                   failing_since=failing_since,
                                   median_interval_s=cadence.median_interval_s if cadence else None,
                                   budget_short=cadence.short if cadence else False))
    return plans


def canary_interval_s(spec: SourceSpec, canary: CanaryState) -> float:
    """How long after its last collection a canary is due again: CANARY_RETRY_S when its own answer
    failed (bounded by the cadence), else the source's cadence (`recrawl_every`, or a learned
    cadence's `recrawl.every`)."""
    if canary_answer_fails(canary, expected_min=spec.expected_min_records):
        return min(CANARY_RETRY_S, spec.recrawl.prior_s)
    return spec.recrawl.prior_s


def queue_canaries(store: StateStore, spec: SourceSpec, *, window: int, not_before: datetime, now: datetime,
                   states: Sequence[CanaryState] | None = None) -> int:
    """Queue the source's canary leads that are due (registering them first: a canary belongs to no
    case, so no other source monitors it): one not collected yet, one whose answer passed a cadence
    ago (origin `canary:<window>`, at the window's jittered `not_before`), and one whose answer
    failed CANARY_RETRY_S ago (origin `canary:<window>:retry:<n>`, n counting CANARY_RETRY_S periods,
    within a tenth of the period). Never one still waiting or running. `states` are the canaries'
    `canary_states`, when the caller has them. Returns how many were queued."""
    if not spec.canaries:
        return 0
    leads = [canary.lead for canary in spec.canaries]
    store.add_leads(leads, now=now)
    states = canary_states(store, spec) if states is None else states
    waiting = store.pending_leads(spec.name, [lead.id for lead in leads])
    queued = 0
    for lead, state in zip(leads, states, strict=True):
        interval_s = canary_interval_s(spec, state)
        if lead.id in waiting or (state.at is not None and state.at > now - timedelta(seconds=interval_s)):
            continue
        origin, start = f"canary:{window}", not_before
        if interval_s < spec.recrawl.prior_s:  # a failing canary: again soon, not on the window's start
            retry = int(now.timestamp() // interval_s)
            rng = random.Random(f"{spec.name}:{lead.id}:{retry}")  # a re-evaluated tick draws the same
            origin = f"canary:{window}:retry:{retry}"
            start = now + timedelta(seconds=jittered_start_s(interval_s, rng=rng, spread=START_SPREAD))
        queued += store.enqueue([(spec.name, lead.id)], origin=origin, priority_class=PriorityClass.RECURRING.value,
                                not_before=start, now=now)
    return queued


def follow_incident(store: StateStore, spec: SourceSpec, states: Sequence[CanaryState]) -> SourceIncident | None:
    """The source's canary record after what its canaries show now (`follow_canaries`), written back
    when it changed. None for a source without canaries, or with nothing to record yet."""
    if not spec.canaries:
        return None
    stored = store.source_incident(spec.name)
    followed = follow_canaries(stored, states, source=spec.name, expected_min=spec.expected_min_records)
    if followed == (stored or SourceIncident(spec.name)):
        return stored
    store.save_source_incident(followed)
    return followed


def requeue_recovered(store: StateStore, spec: SourceSpec, incident: SourceIncident | None, *, now: datetime) -> int:
    """Once a source's canaries pass again, queue once, as `recurring` work, the leads it monitors
    whose latest collection answered empty or failed in the incident's window (from just after the
    last pass before it to the canary collection that passed again; see `follow_canaries`).

    Leads collected with records meanwhile, and empty answers from before the window, are not
    touched; neither is a lead with a collection waiting or running. At most MAX_DUE_PER_SOURCE a
    pass; the incident is marked requeued once none is left. Idempotent: the queue origin names the
    incident (`recovered:<its start, epoch seconds>`), a lead queued under it is never picked again,
    and a lead collected since has left the window. The dispatcher hands them over in batches, within
    the source's bounds and budget, like any recurring crawl. Returns how many were queued."""
    if incident is None or not incident.awaiting_requeue:
        return 0
    start, end = incident.window_start, incident.ended_at
    assert incident.started_at is not None and start is not None and end is not None  # an ended incident has both
    origin = f"recovered:{int(incident.started_at.timestamp())}"
    leads = store.incident_leads(spec.name, lead_kinds=spec.lead_kinds, start=start, end=end, origin=origin,
                                 limit=MAX_DUE_PER_SOURCE)
    queued = store.enqueue([(spec.name, lead) for lead in leads], origin=origin,
                           priority_class=PriorityClass.RECURRING.value, now=now)
    if len(leads) < MAX_DUE_PER_SOURCE:
        store.save_source_incident(replace(incident, requeued_at=now))
    return queued


def max_runtime_s(spec: SourceSpec, leads: int, *, open_to_joins: bool = False) -> int:
    """How long a run of `leads` leads of `spec` may take before it counts as stuck and is stopped
    (`dagster/max_runtime`): its leads at the slowest rate the source's lanes can be cut to (AIMD's
    `min_factor`), across `concurrency` at once, plus the longest one collection can take. A run
    `open_to_joins` (interactive) may take fresh leads for OPEN_FOR_S and linger LINGER_S after its
    last, and owes at most `batch_size` more at a time: that much more."""
    if open_to_joins:
        return max_runtime_s(spec, leads + batch_size(spec)) + int(OPEN_FOR_S + LINGER_S)
    slowest_per_s = spec.rate.source_per_s * spec.throttle.min_factor
    one_collection_s = longest_hold_s(spec)
    rounds = math.ceil(leads / spec.concurrency)
    return int(max(leads / slowest_per_s, rounds * spec.timeout_s) + one_collection_s + RUNTIME_MARGIN_S)


def release_dead_run(store: StateStore, handover_key: str, *, why: str, now: datetime | None = None
                     ) -> tuple[int, list[QueuedCollection]]:
    """A run that ended without collecting what it was handed (its worker killed, stuck and
    stopped, terminated) gives those rows back: each goes back to the queue, to be handed over again
    under a new run key. Rows the run finished or parked are not touched. Returns how many were
    requeued, and the rows dead-lettered.

    Only a lead the run was collecting when it died can have killed it: one it still owes and had
    begun (`StateStore.mark_started`). Those count the death, and one whose runs died
    MAX_RUN_DEATHS times becomes a dead letter (`crashed`) that a human can requeue; their
    batch-mates go back uncounted, so a lead that kills its worker never takes a batch down with it
    (and `batches` hands a lead whose run died over alone). When the run had begun none of them
    (killed at launch), each counts the death, as a lone lead's run does."""
    now = now or utcnow()
    rows = store.handover_rows(handover_key)
    begun = [row for row in rows if row.started_at is not None]
    blamed = begun or rows
    spent = [row for row in blamed if row.run_deaths + 1 >= MAX_RUN_DEATHS]
    requeued = store.requeue_after_run_death([row.id for row in blamed if row not in spent],
                                             outcome=DIED_COLLECTING if begun else RUN_DIED)
    requeued += store.requeue_after_run_death([row.id for row in rows if row not in blamed], deaths=0)
    for row in spent:
        store.put_dead_letter(source=row.source, lead_id=row.lead_id, reason_group="crashed", last_status=None,
                              attempts=row.run_deaths + 1,
                              last_error=f"{row.run_deaths + 1} run(s) ended without collecting it; last: {why}", now=now)
        store.finish_dispatched(row.source, row.lead_id, outcome="failed", now=now)
    return requeued, spent


def release_orphaned_dispatches(store: StateStore, *, owned: Callable[[Sequence[str]], set[str]],
                                now: datetime | None = None) -> int:
    """Rows dispatched ORPHANED_DISPATCH ago or more whose handover no run owns go back to the
    queue, instead of after STALE_DISPATCH. `owned(keys)` answers which of these handover keys a run
    still owns; the caller reads Dagster's run records (a run not finished, or a failed one whose
    retry may still come). Unowned: a tick that claimed rows and died before its run requests
    reached Dagster (the daemon or the code server killed mid-tick), or a run whose promised retry
    never came. A run that turns up later under a released key finds nothing owed (its rows are no
    longer under it)."""
    cutoff = (now or utcnow()) - ORPHANED_DISPATCH
    keys = store.dispatched_handovers(dispatched_before=cutoff)
    alive = owned(keys) if keys else set()
    return store.release_handovers([key for key in keys if key not in alive], dispatched_before=cutoff)


def order_from(positions: Mapping[str, int]) -> Callable[[str], int]:
    """An order of leads from their positions; a lead without one goes last."""
    last = len(positions)
    return lambda lead: positions.get(lead, last)


def _stamp(row: QueuedCollection) -> int:
    return int(row.dispatched_at.timestamp() * 1000) if row.dispatched_at else 0
