"""Recurring crawls pick exactly the stale monitored leads, once per cadence window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from assets.naming import job_name
from investigations.leads import normalize_lead
from investigations.pacing import Circuits
from investigations.priority import BATCH_LEADS_TAG, PriorityClass, run_tags
from investigations.specs import load_sources
from investigations.store import StateStore
from sensors.new_leads import background_runs_of, background_take, batch_size, dispatch
from sensors.recurring import plan_recurring, window_of

ROOT = Path(__file__).resolve().parents[2]
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
    store.record_collection(source=source, lead_id=lead_id, outcome=outcome, records=1, content_hash="h",
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
    plan_recurring(store, catalog, now=NOW)
    depth = store.queue_depths(now=NOW)["robust"]
    assert depth["waiting"] == 1 and depth["ready"] == 0  # starts a little later, not on the tick
    assert store.queue_depths(now=NOW + timedelta(minutes=10))["robust"]["ready"] == 1


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


def test_background_work_is_dispatched_in_batches_with_a_partition_envelope(world) -> None:
    catalog, store = world
    leads = [f"domain-{i:016x}" for i in range(7)]
    order = {lead: position for position, lead in enumerate(leads)}
    store.enqueue([("robust", lead) for lead in reversed(leads[1:6])], origin="recurring:1",
                  priority_class="recurring", now=NOW)
    requests, _ = dispatch(store, catalog, max_runs=50, now=NOW, partition_order=lambda: order)
    (batch,) = requests
    assert batch.partition_key is None
    assert batch.tags["dagster/asset_partition_range_start"] == leads[1]
    assert batch.tags["dagster/asset_partition_range_end"] == leads[5]
    assert batch.tags[BATCH_LEADS_TAG].split(",") == leads[1:6]
    assert batch.tags["investigations/background"] == "true"


def test_batches_are_sized_to_the_source_rate_and_capped(world) -> None:
    catalog, _ = world
    slow = catalog.get("fragile").model_copy(update={"rate": catalog.get("fragile").rate.model_copy(
        update={"source_per_s": 0.1})})
    assert batch_size(slow) == 9  # 90 s of work at 0.1 request/s
    assert batch_size(catalog.get("robust")) == 200  # 900 would be too many leads for one run: batch_max_leads
    small = catalog.get("robust").model_copy(update={"max_in_flight": 30})
    assert batch_size(small) == 30  # a batch never exceeds what may be in flight


def _robust(catalog, **changes):
    return catalog.get("robust").model_copy(update=changes)


@pytest.mark.parametrize(
    ("in_flight", "ready", "taken"),
    [
        (0, 1000, 30),  # concurrency (3) whole batches of 10
        (10, 1000, 20),  # one batch still running: two more
        (25, 1000, 0),  # the room the finished leads freed is less than a batch: wait for a whole one
        (21, 1000, 0),
        (20, 1000, 10),
        (25, 4, 4),  # a backlog smaller than a batch goes out whole when it fits
        (25, 6, 0),  # ... and waits when it does not
        (30, 1000, 0),  # at the bound
    ],
)
def test_background_work_is_handed_over_in_whole_batches_up_to_concurrency_batches(
    world, in_flight: int, ready: int, taken: int
) -> None:
    catalog, _ = world
    spec = _robust(catalog, batch_max_leads=10, concurrency=3)
    assert background_take(spec, in_flight=in_flight, ready=ready) == taken


@pytest.mark.parametrize(
    ("in_flight", "ready", "runs", "taken"),
    [
        (5, 1000, 3, 0),  # three batches near their ends still hold three pool slots
        (5, 1000, 2, 10),  # one run slot free: one batch, however much collection room is left
        (0, 4, 3, 0),  # even a small backlog waits for a run slot
        (0, 1000, 0, 30),
    ],
)
def test_background_work_never_takes_more_than_concurrency_background_runs(
    world, in_flight: int, ready: int, runs: int, taken: int
) -> None:
    catalog, _ = world
    spec = _robust(catalog, batch_max_leads=10, concurrency=3)
    assert background_take(spec, in_flight=in_flight, ready=ready, runs_in_flight=runs) == taken


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
    spec = _robust(catalog, batch_max_leads=10, concurrency=2)
    small = catalog.model_copy(update={"sources": (spec,)})
    leads = [f"domain-{i:016x}" for i in range(50)]
    order = {lead: position for position, lead in enumerate(leads)}
    store.enqueue([("robust", lead) for lead in leads], origin="bulk", priority_class="backfill", now=NOW)
    first, _ = dispatch(store, small, max_runs=50, now=NOW, partition_order=lambda: order)
    assert [r.tags[BATCH_LEADS_TAG].count(",") + 1 for r in first] == [10, 10]
    for lead in first[0].tags[BATCH_LEADS_TAG].split(",")[:9]:  # all but one lead of the first batch
        store.finish_dispatched("robust", lead, outcome="ok", now=NOW)
    held, reasons = dispatch(store, small, max_runs=50, now=NOW, partition_order=lambda: order)
    assert held == [] and any("2 batch(es) of 10" in reason and "30 wait" in reason for reason in reasons)
    store.finish_dispatched("robust", first[0].tags[BATCH_LEADS_TAG].split(",")[9], outcome="ok", now=NOW)
    (next_batch,), _ = dispatch(store, small, max_runs=50, now=NOW, partition_order=lambda: order)
    assert next_batch.tags[BATCH_LEADS_TAG].count(",") + 1 == 10
