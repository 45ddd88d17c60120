"""The dispatcher: what each source hands to Dagster and why the rest waits; recurring planning."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from assets.naming import job_name
from investigations.intake.leads import normalize_lead
from investigations.pacing import Circuits
from investigations.pacing.circuit import CircuitState
from investigations.scheduling.dispatch import (
    MAX_RUN_DEATHS,
    ORPHANED_DISPATCH,
    Handover,
    background_runs_for,
    background_take,
    batch_size,
    circuit_gate,
    ingest,
    join_collectors,
    max_runtime_s,
    order_from,
    overlap_leads,
    plan_dispatch,
    plan_recurring,
    release_dead_run,
    release_orphaned_dispatches,
    wanted_sources,
    window_of,
)
from investigations.scheduling.priority import PriorityClass, run_tags
from investigations.sources.specs import load_sources
from investigations.store import DIED_COLLECTING, InboxItem, StateStore
from sensors.new_leads import background_runs_of

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.fixture
def world(sandbox_env):
    catalog = load_sources(ROOT / "sources.yaml")  # robust: recrawl_every 6h, takes domain/username/email/org
    store = StateStore.from_url(f"sqlite:///{sandbox_env / 'state.db'}")
    yield catalog, store
    store.close()


def _lead(store, value, *, cases=("active-case",), kind="domain"):
    lead = normalize_lead(kind, value)
    for case in cases:
        store.add_lead(lead, case_id=case, now=NOW - timedelta(days=2))
    return lead.id


def _collected(store, lead_id, *, hours_ago, source="robust", outcome="ok"):
    store.complete_collection(source=source, lead_id=lead_id, outcome=outcome, records=1, content_hash="h",
                              path="/p", run_id="r", now=NOW - timedelta(hours=hours_ago))


def test_recurring_selection_picks_exactly_the_stale_monitored_leads(world) -> None:
    catalog, store = world
    store.add_lead(normalize_lead("domain", "placeholder.example"), case_id="closed-case")
    store.set_case_status("closed-case", "closed")
    due = _lead(store, "due.example")
    fresh = _lead(store, "fresh.example")
    closed_only = _lead(store, "closed.example", cases=("closed-case",))
    closed_and_active = _lead(store, "shared.example", cases=("closed-case", "active-case"))
    dead = _lead(store, "dead.example")
    pending = _lead(store, "pending.example")
    never = _lead(store, "never.example")
    wrong_kind = _lead(store, "1.2.3.4", kind="ip")
    for lead, hours in ((due, 7), (fresh, 1), (closed_only, 30), (closed_and_active, 8), (dead, 9),
                        (pending, 10), (wrong_kind, 12)):
        _collected(store, lead, hours_ago=hours)
    store.put_dead_letter(source="robust", lead_id=dead, reason_group="transient", last_status=500, attempts=4,
                          last_error="HTTP 500", now=NOW - timedelta(hours=1))
    store.enqueue([("robust", pending)], origin="inbox:1", priority_class="interactive", now=NOW)
    spec = catalog.get("robust")
    picked = store.stale_monitored("robust", lead_kinds=spec.lead_kinds, older_than=NOW - timedelta(hours=6), limit=100)
    assert picked == [closed_and_active, due]  # stalest first
    assert never not in picked


def test_a_window_is_queued_once_and_the_next_window_again(world) -> None:
    catalog, store = world
    lead = _lead(store, "due.example")
    _collected(store, lead, hours_ago=7)
    first = {p.source: p for p in plan_recurring(store, catalog, now=NOW)}["robust"]
    again = {p.source: p for p in plan_recurring(store, catalog, now=NOW + timedelta(minutes=5))}["robust"]
    assert (first.due, first.queued) == (1, 1)
    assert again.due == 0  # already waiting in the backlog for this window
    spec = catalog.get("robust")
    later = NOW + timedelta(seconds=spec.recrawl_every_s)
    store.finish_dispatched("robust", lead, outcome="failed")  # nothing ran; free the row
    store.dispatch("robust", limit=10, now=later)
    store.finish_dispatched("robust", lead, outcome="failed", now=later)
    next_window = {p.source: p for p in plan_recurring(store, catalog, now=later)}["robust"]
    assert next_window.window == window_of(spec, later) != first.window and next_window.queued == 1


def test_recurring_start_times_are_jittered_within_the_window(world) -> None:
    catalog, store = world
    lead = _lead(store, "due.example")
    _collected(store, lead, hours_ago=7)
    plan = {p.source: p for p in plan_recurring(store, catalog, now=NOW)}["robust"]
    queued = plan.queued + plan.canaries  # the lead and robust's canary
    depth = store.queue_depths(now=NOW)["robust"]
    assert depth["waiting"] == queued == 2 and depth["ready"] == 0  # starts a little later, not on the tick
    assert store.queue_depths(now=NOW + timedelta(minutes=10))["robust"]["ready"] == queued


def test_a_resting_source_and_a_full_backlog_are_skipped_with_a_reason(world) -> None:
    catalog, store = world
    lead = _lead(store, "due.example")
    _collected(store, lead, hours_ago=7)
    _collected(store, lead, hours_ago=30, source="fragile")
    fragile = catalog.get("fragile")
    circuits = Circuits(store)
    for _ in range(fragile.circuit.failure_threshold):
        circuits.record("fragile", fragile.circuit, success=False)
    robust = catalog.get("robust")
    store.enqueue([("robust", f"other{i}") for i in range(5 * robust.max_in_flight)], origin="bulk",
                  priority_class="backfill", now=NOW)
    plans = {p.source: p for p in plan_recurring(store, catalog, now=NOW, circuits=circuits)}
    assert plans["fragile"].skipped == "circuit open"
    assert plans["robust"].skipped.startswith("backlog full")


def test_background_work_is_handed_over_in_batches_in_the_caller_s_lead_order(world) -> None:
    catalog, store = world
    leads = [f"domain-{i:016x}" for i in range(7)]
    order = order_from({lead: position for position, lead in enumerate(leads)})
    store.enqueue([("robust", lead) for lead in reversed(leads[1:6])], origin="recurring:1",
                  priority_class="recurring", now=NOW)
    (batch,) = plan_dispatch(store, catalog, max_runs=50, now=NOW, order=order).handovers
    assert batch.is_batch and batch.priority_class is PriorityClass.RECURRING
    assert batch.lead_ids == leads[1:6]


def test_a_case_s_interactive_leads_go_out_together_per_case_before_background_work(world) -> None:
    catalog, store = world
    store.enqueue([("robust", "domain-bulk")], origin="backfill:1", priority_class="backfill", now=NOW)
    store.enqueue([("robust", f"domain-a{i}") for i in range(3)], origin="inbox:1", priority_class="interactive",
                  case_id="case-a", now=NOW)
    store.enqueue([("robust", "domain-b")], origin="inbox:2", priority_class="interactive", case_id="case-b", now=NOW)
    handovers = plan_dispatch(store, catalog, max_runs=50, now=NOW).handovers
    assert [(h.priority_class.value, h.case_id, h.lead_ids) for h in handovers] == [
        ("interactive", "case-a", ["domain-a0", "domain-a1", "domain-a2"]),  # as the case sent them
        ("interactive", "case-b", ["domain-b"]),  # a lone fresh lead: a run of its own, at once
        ("backfill", None, ["domain-bulk"]),
    ]


@pytest.mark.parametrize(("leads", "runs"), [(1, 1), (135, 1), (136, 2), (300, 3)])
def test_interactive_runs_are_sized_by_the_source_rate(world, leads, runs) -> None:
    catalog, store = world
    spec = catalog.get("fragile")  # 1.5/s: 135-lead runs, as its background batches
    store.enqueue([("fragile", f"domain-{i}") for i in range(leads)], origin="inbox:1",
                  priority_class="interactive", case_id="c", now=NOW)
    handovers = plan_dispatch(store, catalog, max_runs=50, now=NOW).handovers
    assert len(handovers) == runs and max(len(h.rows) for h in handovers) <= batch_size(spec)
    assert sum(len(h.rows) for h in handovers) == leads


def _rows(store, source, leads, *, case="c", outcome=None):
    store.enqueue([(source, lead) for lead in leads], origin=f"inbox:{case}", priority_class="interactive",
                  case_id=case, now=NOW)
    rows = store.dispatch(source, limit=len(leads), now=NOW)
    return tuple(replace(row, outcome=outcome) for row in rows)


@pytest.mark.parametrize(
    ("leads", "open_runs", "outcome", "joins"),
    [
        (1, [("run-a", 5), ("run-b", 2)], None, "run-b"),  # a fresh lead joins the least loaded open run
        (3, [("run-a", 0)], None, "run-a"),  # a few leads (at most concurrency, 3 on robust) join too
        (4, [("run-a", 0)], None, None),  # a case worth more is a run of its own, with its case's tag
        (1, [], None, None),  # nothing open: a run of its own
        (1, [("run-a", 900)], None, None),  # the open run owes a whole batch (90 s of work) already
        (1, [("run-a", 0)], DIED_COLLECTING, None),  # its last run died collecting it: it stays alone
    ],
)
def test_small_interactive_handovers_join_an_open_run_of_their_source(world, leads, open_runs, outcome, joins) -> None:
    catalog, store = world
    spec = catalog.get("robust")
    handover = Handover("robust", PriorityClass.INTERACTIVE,
                        _rows(store, "robust", [f"domain-{i}" for i in range(leads)], outcome=outcome))
    (planned,) = join_collectors(spec, [handover], open_runs)
    assert planned.joins == joins and planned.rows == handover.rows
    assert planned.key == (joins or handover.key)


def test_background_work_never_joins_an_open_run(world) -> None:
    catalog, store = world
    store.enqueue([("robust", "domain-bulk")], origin="backfill:1", priority_class="backfill", now=NOW)
    handover = Handover("robust", PriorityClass.BACKFILL, tuple(store.dispatch("robust", limit=1, now=NOW)))
    assert join_collectors(catalog.get("robust"), [handover], [("run-a", 0)])[0].joins is None


def test_a_pass_joins_a_fresh_lead_to_the_open_run_of_its_source_only(world) -> None:
    catalog, store = world
    store.open_collector("robust:open", "robust", until_s=NOW.timestamp() + 5)
    store.enqueue([("robust", "domain-1"), ("flaky", "domain-1")], origin="inbox:1", priority_class="interactive",
                  case_id="c", now=NOW)
    handovers = {h.source: h for h in plan_dispatch(store, catalog, max_runs=10, now=NOW).handovers}
    assert handovers["robust"].joins == "robust:open"
    assert handovers["flaky"].joins is None  # flaky has no open run: a run of its own


def test_a_handover_again_gets_a_new_key(world) -> None:
    catalog, store = world
    store.enqueue([("robust", "domain-1")], origin="inbox:1", priority_class="interactive", now=NOW)
    (first,) = plan_dispatch(store, catalog, max_runs=5, now=NOW).handovers
    assert plan_dispatch(store, catalog, max_runs=5, now=NOW).handovers == []  # dispatched: not again
    store.release_stale_dispatches(older_than=NOW + timedelta(seconds=1))  # its run died
    (again,) = plan_dispatch(store, catalog, max_runs=5, now=NOW + timedelta(minutes=1)).handovers
    assert again.lead_ids == first.lead_ids and again.key != first.key  # Dagster never skips it


def test_batches_are_sized_to_the_source_rate_and_capped(world) -> None:
    catalog, _ = world
    slow = catalog.get("fragile").model_copy(update={"rate": catalog.get("fragile").rate.model_copy(
        update={"source_per_s": 0.1})})
    assert batch_size(slow) == 9  # 90 s of work at 0.1 request/s
    assert batch_size(catalog.get("robust")) == 900  # 90 s at 10/s
    capped = catalog.get("robust").model_copy(update={"batch_max_leads": 200})
    assert batch_size(capped) == 200


def _with_rate(spec, source_per_s: float, **changes):
    return spec.model_copy(update={"rate": spec.rate.model_copy(update={"source_per_s": source_per_s}), **changes})


@pytest.mark.parametrize(
    ("source_per_s", "batch_max_leads", "runs"),
    [
        (0.1, 1000, 2),  # a 90 s batch (9 leads): a second run starts while the first winds down
        (10, 1000, 2),  # 900 leads, 90 s
        (30, 1000, 2),  # 1000 leads, 33 s
        (30, 200, 4),  # 200 leads fill in 6.7 s: three more runs cover a run's 15 s start and end
        (100, 200, 9),  # 2 s batches: 1 + 15 / 2, so the lanes never wait on a run start
        (5, 10, 9),
    ],
)
def test_background_runs_of_a_source_are_derived_from_its_rate(world, source_per_s, batch_max_leads, runs) -> None:
    catalog, _ = world
    spec = _with_rate(catalog.get("robust"), source_per_s, batch_max_leads=batch_max_leads)
    assert background_runs_for(spec) == runs


def _three_runs(catalog):
    # 10-lead batches at 1/s (10 s each): 1 + ceil(15 / 10) = 3 background runs.
    return _with_rate(catalog.get("robust"), 1, batch_max_leads=10)


@pytest.mark.parametrize(
    ("in_flight", "ready", "taken"),
    [
        (0, 1000, 20),  # two whole batches of 10: the second starts within the first's 15 leads of overlap
        (10, 1000, 10),  # one batch still running: one more
        (15, 1000, 10),  # at the overlap (15 s of work at 1/s) the next batch goes
        (16, 1000, 0),  # more than the overlap in flight: the next batch waits for the runs to near their ends
        (25, 1000, 0),
        (15, 4, 10),  # room for a batch: a backlog smaller than one goes out whole
        (16, 4, 0),  # ... and waits, as a batch would, while more than the overlap is in flight
        (0, 0, 0),  # nothing ready
        (30, 1000, 0),  # at the bound
    ],
)
def test_background_work_is_handed_over_in_whole_batches_up_to_the_source_s_runs(
    world, in_flight: int, ready: int, taken: int
) -> None:
    catalog, _ = world
    spec = _three_runs(catalog)
    assert background_runs_for(spec) == 3
    assert background_take(spec, in_flight=in_flight, ready=ready) == taken


@pytest.mark.parametrize(
    ("in_flight", "ready", "runs", "taken"),
    [
        (5, 1000, 3, 0),  # three batches near their ends still hold three pool slots
        (5, 1000, 2, 10),  # one run slot free: one batch, however much collection room is left
        (0, 4, 3, 0),  # even a small backlog waits for a run slot
        (0, 1000, 0, 20),
    ],
)
def test_background_work_never_takes_more_than_the_source_s_background_runs(
    world, in_flight: int, ready: int, runs: int, taken: int
) -> None:
    catalog, _ = world
    assert background_take(_three_runs(catalog), in_flight=in_flight, ready=ready, runs_in_flight=runs) == taken


@pytest.mark.parametrize(
    ("in_flight", "taken"),
    [
        (0, 720),  # a fresh backfill starts one run, not two splitting the lanes for 90 s
        (600, 0),  # the run is 15 s into its batch: the next waits
        (121, 0),
        (120, 720),  # 15 s of work left at 8/s: the next run starts as this one winds down
    ],
)
def test_a_source_s_background_runs_are_staggered_by_its_overlap(world, in_flight: int, taken: int) -> None:
    catalog, _ = world
    spec = _with_rate(catalog.get("robust"), 8)  # 720-lead batches, 2 runs, 120 leads of overlap
    assert (batch_size(spec), background_runs_for(spec), overlap_leads(spec)) == (720, 2, 120)
    assert background_take(spec, in_flight=in_flight, ready=5000, runs_in_flight=1 if in_flight else 0) == taken


def test_background_runs_in_flight_are_counted_from_dagster_per_source() -> None:
    instance = DagsterInstance.ephemeral()
    statuses = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTED, DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE]
    for status in statuses:
        instance.add_run(DagsterRun(job_name=job_name("robust"), status=status, tags=run_tags(PriorityClass.BACKFILL)))
    instance.add_run(DagsterRun(job_name=job_name("robust"), status=DagsterRunStatus.STARTED,
                                tags=run_tags(PriorityClass.INTERACTIVE)))
    instance.add_run(DagsterRun(job_name=job_name("slow"), status=DagsterRunStatus.STARTING,
                                tags=run_tags(PriorityClass.RECURRING)))
    count = background_runs_of(instance)
    assert (count("robust"), count("slow"), count("quiet")) == (2, 1, 0)


def test_a_trickle_of_finished_leads_does_not_start_small_batch_runs(world) -> None:
    catalog, store = world
    spec = _with_rate(catalog.get("robust"), 0.5, batch_max_leads=10)  # 20 s batches: 2 runs, 8 leads of overlap
    small = catalog.model_copy(update={"sources": (spec,)})
    leads = [f"domain-{i:016x}" for i in range(50)]
    order = order_from({lead: position for position, lead in enumerate(leads)})
    store.enqueue([("robust", lead) for lead in leads], origin="bulk", priority_class="backfill", now=NOW)
    (first,) = plan_dispatch(store, small, max_runs=50, now=NOW, order=order).handovers
    assert len(first.rows) == 10
    store.finish_dispatched("robust", first.lead_ids[0], outcome="ok", now=NOW)
    held = plan_dispatch(store, small, max_runs=50, now=NOW, order=order)
    assert held.handovers == []
    assert any("2 batch(es) of 10" in r and "at most 8 are left" in r and "40 wait" in r for r in held.reasons)
    store.finish_dispatched("robust", first.lead_ids[1], outcome="ok", now=NOW)
    (next_batch,) = plan_dispatch(store, small, max_runs=50, now=NOW, order=order).handovers
    assert len(next_batch.rows) == 10


def test_a_batch_run_reads_the_members_it_still_owes_from_the_queue(world) -> None:
    catalog, store = world
    leads = [f"domain-{i:016x}" for i in range(3)]
    store.enqueue([("robust", lead) for lead in leads], origin="bulk", priority_class="backfill", now=NOW)
    (batch,) = plan_dispatch(store, catalog, max_runs=5, now=NOW, order=order_from({})).handovers
    store.assign_handover([row.id for row in batch.rows], handover_key=batch.key)
    assert store.handover_leads(batch.key) == leads
    store.finish_dispatched("robust", leads[0], outcome="ok", now=NOW)
    store.park_dispatched("robust", leads[1], until=NOW)
    assert store.handover_leads(batch.key) == [leads[2]]  # a retried step skips what is done or parked


def _item(lead, *, sources, priority="interactive") -> InboxItem:
    return InboxItem(id=7, webhook_id="w", case_id="c", lead=lead, sources=sources, priority_class=priority,
                     received_at=datetime.now(UTC))


def test_without_sources_a_lead_goes_to_every_source_taking_its_kind(world) -> None:
    catalog, _ = world
    names, skipped = wanted_sources(_item(normalize_lead("email", "bob@example.com"), sources=None), catalog)
    assert names == [s.name for s in catalog.for_kind("email")] and skipped == []


def test_a_wanted_source_that_cannot_take_the_lead_is_skipped_with_a_reason(world) -> None:
    catalog, _ = world
    item = _item(normalize_lead("email", "bob@example.com"), sources=["robust", "flaky", "gone"])
    names, skipped = wanted_sources(item, catalog)
    assert names == ["robust"]
    assert any("flaky: does not take email" in s for s in skipped)
    assert any("gone: no longer in sources.yaml" in s for s in skipped)


def test_a_resting_source_keeps_its_work_in_the_backlog_then_sends_one_probe(world) -> None:
    catalog, store = world
    spec = catalog.get("robust")
    circuits = Circuits(store)
    for _ in range(spec.circuit.failure_threshold):
        circuits.record("robust", spec.circuit, success=False)
    leads = [normalize_lead("domain", value) for value in ("a.example", "b.example")]
    store.accept_leads(webhook_id="w1", case_id="c1", leads=leads, sources=["robust"], priority_class="interactive")
    ingest(store, store.inbox_after(0, limit=10), catalog)
    probe_at = datetime.fromtimestamp(circuits.state("robust").probe_at_s, UTC)

    resting = plan_dispatch(store, catalog, max_runs=10, circuits=circuits, now=probe_at - timedelta(seconds=5))
    assert resting.handovers == [] and any("circuit open" in r and "probe in 5 s" in r for r in resting.reasons)
    probe = plan_dispatch(store, catalog, max_runs=10, circuits=circuits, now=probe_at + timedelta(seconds=1))
    assert len(probe.handovers) == 1 and any("one probe" in r for r in probe.reasons)
    again = plan_dispatch(store, catalog, max_runs=10, circuits=circuits, now=probe_at + timedelta(seconds=2))
    assert again.handovers == []  # one probe at a time


@pytest.mark.parametrize(
    ("state", "probe_in_s", "room", "closed"),
    [
        (None, None, None, True),  # never recorded a result
        ("closed", None, None, True),
        ("open", 5.0, 0, False),  # resting
        ("open", -1.0, 1, False),  # rest over: one probe
        ("half_open", None, 0, False),  # its probe is out
    ],
)
def test_the_circuit_gate_every_caller_uses(state, probe_in_s, room, closed) -> None:
    class OneCircuit:
        def state(self, _source):
            if state is None:
                return None
            probe_at = None if probe_in_s is None else 100.0 + probe_in_s
            return CircuitState(state=state, failure_streak=5, opened_at_s=90.0, probe_at_s=probe_at, opens=1)

    gate = circuit_gate(OneCircuit(), "robust", now_s=100.0)  # type: ignore[arg-type]
    assert (gate.room, gate.closed) == (room, closed)
    assert (gate.reason is None) is closed


def _handed_over(store, leads, *, key="robust:batch:dead"):
    store.enqueue([("robust", lead) for lead in leads], origin="backfill:1", priority_class="backfill", now=NOW)
    rows = store.dispatch("robust", limit=len(leads), now=NOW)
    store.assign_handover([row.id for row in rows], handover_key=key)
    return key


def test_a_dead_run_gives_back_what_it_still_owed_and_nothing_it_finished(world) -> None:
    _, store = world
    key = _handed_over(store, ["domain-1", "domain-2", "domain-3"])
    store.finish_dispatched("robust", "domain-1", outcome="ok", now=NOW)
    requeued, spent = release_dead_run(store, key, why="run r1 FAILURE", now=NOW)
    assert (requeued, spent) == (2, [])
    assert store.handover_leads(key) == [] and store.queue_depths(now=NOW)["robust"]["ready"] == 2
    assert release_dead_run(store, key, why="read again", now=NOW) == (0, [])  # idempotent


def test_a_lead_whose_runs_keep_dying_becomes_a_crashed_dead_letter(world) -> None:
    _, store = world
    for death in range(1, MAX_RUN_DEATHS + 1):
        key = _handed_over(store, ["domain-1"], key=f"robust:domain-1:{death}")
        requeued, spent = release_dead_run(store, key, why=f"run r{death} FAILURE", now=NOW)
        assert (requeued, len(spent)) == ((1, 0) if death < MAX_RUN_DEATHS else (0, 1))
    (letter,) = store.dead_letters(source="robust")
    assert letter.reason_group == "crashed" and letter.attempts == MAX_RUN_DEATHS and "r3 FAILURE" in letter.last_error
    assert store.queue_depths(now=NOW).get("robust", {}).get("ready", 0) == 0


def test_only_the_lead_a_dead_batch_was_collecting_counts_the_death_and_goes_out_alone(world) -> None:
    catalog, store = world
    key = _handed_over(store, ["domain-1", "domain-2", "domain-3", "domain-4"])
    store.mark_started("robust", "domain-1", now=NOW)
    store.finish_dispatched("robust", "domain-1", outcome="ok", now=NOW)
    store.mark_started("robust", "domain-3", now=NOW)  # being collected when the worker died
    assert release_dead_run(store, key, why="run r1 FAILURE", now=NOW) == (3, [])
    handovers = plan_dispatch(store, catalog, max_runs=10, now=NOW + timedelta(seconds=2)).handovers
    assert sorted((h.lead_ids, h.rows[0].run_deaths) for h in handovers) == [
        (["domain-2", "domain-4"], 0),  # its batch-mates: no death counted, still a batch
        (["domain-3"], 1),  # the suspect, alone: if it kills its worker again, it dies alone
    ]


def test_a_lead_that_keeps_killing_its_batch_becomes_a_dead_letter_alone(world) -> None:
    _, store = world
    mates = ["domain-1", "domain-2", "domain-3"]
    key = _handed_over(store, ["domain-0", *mates])
    for death in range(1, MAX_RUN_DEATHS + 1):
        store.mark_started("robust", "domain-0", now=NOW)
        requeued, spent = release_dead_run(store, key, why=f"run r{death} FAILURE", now=NOW)
        if death < MAX_RUN_DEATHS:
            rows = store.dispatch("robust", limit=5, now=NOW)
            store.assign_handover([row.id for row in rows], handover_key=key)
    assert [row.lead_id for row in spent] == ["domain-0"] and requeued == len(mates)
    assert [letter.lead_id for letter in store.dead_letters(source="robust")] == ["domain-0"]
    assert sorted(row.lead_id for row in store.dispatch("robust", limit=5, now=NOW)) == mates
    assert all(row.run_deaths == 0 for row in store.dispatch("robust", limit=5, now=NOW))


def test_a_batch_killed_before_it_began_any_lead_counts_the_death_against_each_and_stays_a_batch(world) -> None:
    catalog, store = world
    key = _handed_over(store, ["domain-1", "domain-2"])
    assert release_dead_run(store, key, why="run r1 FAILURE", now=NOW) == (2, [])
    (again,) = plan_dispatch(store, catalog, max_runs=10, now=NOW).handovers
    assert again.lead_ids == ["domain-1", "domain-2"] and {row.run_deaths for row in again.rows} == {1}


def test_rows_claimed_by_a_tick_whose_run_was_never_created_go_back_after_the_orphan_delay(world) -> None:
    """The daemon killed between a tick's claim and the run's creation: no run carries the handover."""
    _, store = world
    lost = _handed_over(store, ["domain-1", "domain-2"], key="robust:batch:lost")
    running = _handed_over(store, ["domain-3"], key="robust:domain-3:q3:d1")
    store.enqueue([("robust", "domain-4")], origin="inbox:9", priority_class="interactive", now=NOW)
    store.dispatch("robust", limit=1, now=NOW)  # claimed, killed before its handover was named
    asked: list[list[str]] = []

    def runs_exist(keys):
        asked.append(sorted(keys))
        return {running}

    early = NOW + ORPHANED_DISPATCH - timedelta(seconds=1)
    assert release_orphaned_dispatches(store, owned=runs_exist, now=early) == 0
    assert asked == []  # nothing old enough: Dagster is not even asked
    later = NOW + ORPHANED_DISPATCH + timedelta(seconds=1)
    assert release_orphaned_dispatches(store, owned=runs_exist, now=later) == 3
    assert asked == [sorted([lost, running])]
    assert store.handover_leads(lost) == [] and store.handover_leads(running) == ["domain-3"]
    depths = store.queue_depths(now=later)["robust"]
    assert (depths["ready"], depths["dispatched"]) == (3, 1)
    rows = store.dispatch("robust", limit=3, now=later)
    assert sorted(row.lead_id for row in rows) == ["domain-1", "domain-2", "domain-4"]
    assert all(row.run_deaths == 0 for row in rows)  # no run died: nothing counts toward `crashed`


@pytest.mark.parametrize(
    ("source_per_s", "leads", "at_least_s", "at_most_s"),
    [
        (10, 1, 300, 900),  # one lead: the longest single collection and the margin
        (10, 900, 1800, 2700),  # 900 leads at 5 % of 10/s: 1,800 s
        (30, 1000, 1670, 2400),  # 334 rounds of 3 leads, each answer at the 5 s timeout
    ],
)
def test_a_run_s_max_runtime_covers_its_leads_at_the_slowest_throttled_rate(
    world, source_per_s, leads, at_least_s, at_most_s
) -> None:
    catalog, _ = world
    assert at_least_s <= max_runtime_s(_with_rate(catalog.get("robust"), source_per_s), leads) <= at_most_s


def test_a_source_s_canaries_are_registered_and_queued_once_per_cadence_window(world) -> None:
    catalog, store = world
    robust = catalog.get("robust")
    canary = robust.canaries[0].lead
    first = {p.source: p for p in plan_recurring(store, catalog, now=NOW)}
    assert first["robust"].canaries == 1 and first["fragile"].canaries == 0  # fragile names none
    assert store.get_lead(canary.id) == canary
    again = {p.source: p for p in plan_recurring(store, catalog, now=NOW + timedelta(minutes=5))}
    assert again["robust"].canaries == 0  # still waiting in the backlog
    (row,) = [r for r in store.dispatch("robust", limit=10, now=NOW + timedelta(hours=1))]
    assert (row.lead_id, row.origin, row.priority_class) == (canary.id, f"canary:{window_of(robust, NOW)}", "recurring")
    _collected(store, canary.id, hours_ago=0)
    store.finish_dispatched("robust", canary.id, outcome="ok")
    assert {p.source: p for p in plan_recurring(store, catalog, now=NOW + timedelta(hours=1))}["robust"].canaries == 0
    later = NOW + timedelta(seconds=robust.recrawl_every_s + 60)
    assert {p.source: p for p in plan_recurring(store, catalog, now=later)}["robust"].canaries == 1
