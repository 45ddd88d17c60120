"""Recovery without waiting for the cadence: a source whose canary fails is watched every few minutes,
and once its canary passes again, the leads its incident left empty or failed are collected again."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from investigations.intake.leads import normalize_lead
from investigations.pacing import Circuits
from investigations.scheduling.dispatch import CANARY_RETRY_S, RecurringPlan, plan_dispatch, plan_recurring, window_of
from investigations.sources.specs import parse_sources
from investigations.store import StateStore
from investigations.store import schema as s

T0 = datetime(2026, 12, 2, 0, 0, tzinfo=UTC)
CATALOG = parse_sources("""
sources:
  - name: quiet
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://quiet.example/api?q={value}"}
    rate: {source_per_s: 5, source_burst: 5, identity_per_s: 5, identity_burst: 5}
    recrawl_every: 6h
    expected_min_records: 1
    canaries: [{kind: domain, value: canary.example}]
""")
QUIET = CATALOG.get("quiet")
CANARY = QUIET.canaries[0].lead.id


def monitored(store: StateStore, value: str, *, case: str = "case-1") -> str:
    lead = normalize_lead("domain", value)
    store.add_lead(lead, case_id=case, now=T0 - timedelta(days=2))
    return lead.id


def collect(store: StateStore, lead_id: str, *, at: datetime, records: int, failed: bool = False) -> None:
    """What a run does with one collection of `quiet`: its queued rows taken, then closed with the answer."""
    q = s.collection_queue
    with store.engine.begin() as conn:
        conn.execute(q.update().where(q.c.source == "quiet", q.c.lead_id == lead_id, q.c.state == "queued")
                     .values(state="dispatched", dispatched_at=at))
    if failed:
        store.put_dead_letter(source="quiet", lead_id=lead_id, reason_group="transient", last_status=503, attempts=4,
                              last_error="HTTP 503", now=at)
    outcome = "failed" if failed else "ok" if records else "empty"
    store.complete_collection(source="quiet", lead_id=lead_id, outcome=outcome, records=records,
                              content_hash=None if failed else "h", path=None if failed else "/p", run_id="r", now=at)


def tick(store: StateStore, at: datetime) -> RecurringPlan:
    return {plan.source: plan for plan in plan_recurring(store, CATALOG, now=at)}["quiet"]


def queued(store: StateStore, *, origin_prefix: str) -> list[tuple[str, str, str]]:
    q = s.collection_queue
    with store.engine.begin() as conn:
        rows = conn.execute(q.select().where(q.c.source == "quiet", q.c.origin.like(f"{origin_prefix}%"))
                            .order_by(q.c.lead_id)).mappings().all()
    return [(row["lead_id"], row["origin"], row["priority_class"]) for row in rows]


def an_incident(store: StateStore) -> tuple[datetime, datetime]:
    """The canary passes at T0 and answers empty at T0 + 2 h (the incident starts), each followed by a
    pass of the planner; it passes again at T0 + 3 h 30 (the caller's pass ends it). Returns (start, end)."""
    collect(store, CANARY, at=T0, records=2)
    tick(store, T0 + timedelta(minutes=1))
    started = T0 + timedelta(hours=2)
    collect(store, CANARY, at=started, records=0)
    assert tick(store, started + timedelta(minutes=1)).failing_since == started
    ended = T0 + timedelta(hours=3, minutes=30)
    collect(store, CANARY, at=ended, records=2)
    return started, ended


def test_an_incident_s_empty_and_failed_leads_are_queued_again_once_its_canary_passes_again(store) -> None:
    old_empty = monitored(store, "old-empty.example")
    collect(store, old_empty, at=T0 - timedelta(hours=1), records=0)  # before the last pass: a true empty
    during_empty, during_failed, during_ok, after_empty = (
        monitored(store, f"{name}.example") for name in ("during-empty", "during-failed", "during-ok", "after-empty"))
    collect(store, during_empty, at=T0 + timedelta(hours=2, minutes=30), records=0)
    collect(store, during_failed, at=T0 + timedelta(hours=2, minutes=40), records=0, failed=True)
    collect(store, during_ok, at=T0 + timedelta(hours=2, minutes=50), records=4)
    started, ended = an_incident(store)
    collect(store, after_empty, at=ended + timedelta(minutes=10), records=0)  # the source works again: a true empty
    plan = tick(store, ended + timedelta(minutes=30))
    origin = f"recovered:{int(started.timestamp())}"
    assert plan.recovered == 2 and plan.failing_since is None
    assert queued(store, origin_prefix="recovered:") == sorted(
        [(during_empty, origin, "recurring"), (during_failed, origin, "recurring")])


def test_the_window_begins_just_after_the_last_canary_pass_before_the_incident(store) -> None:
    # Answered empty between the last pass (T0) and the first failing canary (T0 + 2 h): the source
    # was no longer known to work, so it is collected again too; an empty answer before that pass is not.
    at_pass, in_gap = monitored(store, "at-pass.example"), monitored(store, "in-gap.example")
    collect(store, at_pass, at=T0 - timedelta(seconds=1), records=0)
    collect(store, in_gap, at=T0 + timedelta(hours=1), records=0)
    _, ended = an_incident(store)
    assert tick(store, ended + timedelta(minutes=1)).recovered == 1
    assert [lead for lead, _, _ in queued(store, origin_prefix="recovered:")] == [in_gap]


def test_only_leads_of_active_cases_are_collected_again(store) -> None:
    active, closed = monitored(store, "active.example"), monitored(store, "closed.example", case="case-2")
    store.set_case_status("case-2", "closed")
    for lead in (active, closed):
        collect(store, lead, at=T0 + timedelta(hours=3), records=0)
    _, ended = an_incident(store)
    assert tick(store, ended + timedelta(minutes=1)).recovered == 1
    assert [lead for lead, _, _ in queued(store, origin_prefix="recovered:")] == [active]


def test_the_recovery_rule_queues_nothing_twice_across_passes(store) -> None:
    leads = [monitored(store, f"during-{i}.example") for i in range(3)]
    for i, lead in enumerate(leads):
        collect(store, lead, at=T0 + timedelta(hours=2, minutes=10 + i), records=0)
    _, ended = an_incident(store)
    first = ended + timedelta(minutes=1)
    assert tick(store, first).recovered == 3
    assert tick(store, first + timedelta(minutes=1)).recovered == 0
    # A pass that queued them and died before marking the incident requeued queues nothing again either,
    incident = store.source_incident("quiet")
    assert incident is not None and incident.requeued_at == first
    store.save_source_incident(replace(incident, requeued_at=None))
    assert tick(store, first + timedelta(minutes=2)).recovered == 0
    # nor once they were collected again (still empty: now a true empty) and the rows are done.
    for lead in leads:
        collect(store, lead, at=first + timedelta(minutes=3), records=0)
    assert tick(store, first + timedelta(minutes=4)).recovered == 0
    assert len(queued(store, origin_prefix="recovered:")) == 3


def test_leads_queued_again_go_out_as_one_recurring_batch(store) -> None:
    leads = [monitored(store, f"during-{i}.example") for i in range(4)]
    for lead in leads:
        collect(store, lead, at=T0 + timedelta(hours=3), records=0)
    _, ended = an_incident(store)
    at = ended + timedelta(minutes=1)
    assert tick(store, at).recovered == 4
    (handover,) = plan_dispatch(store, CATALOG, max_runs=10, now=at).handovers
    assert handover.priority_class.value == "recurring" and sorted(handover.lead_ids) == sorted(leads)


@pytest.mark.parametrize(
    ("records", "not_yet", "due", "origin"),
    [
        # Its answer failed: again CANARY_RETRY_S after it, within a tenth of the period.
        (0, timedelta(seconds=CANARY_RETRY_S - 60), timedelta(seconds=CANARY_RETRY_S), "canary:{window}:retry:"),
        # It passed: again a cadence (6 h) after it.
        (2, timedelta(hours=5, minutes=59), timedelta(hours=6), "canary:{window}"),
    ],
    ids=["failing", "passing"],
)
def test_a_failing_canary_is_collected_again_within_minutes_and_a_passing_one_on_the_cadence(
    store, records, not_yet, due, origin
) -> None:
    tick(store, T0 - timedelta(minutes=30))  # registers the canary and queues its first collection
    collect(store, CANARY, at=T0, records=records)
    assert tick(store, T0 + not_yet).canaries == 0
    at = T0 + due
    assert tick(store, at).canaries == 1
    q = s.collection_queue
    with store.engine.begin() as conn:
        row = conn.execute(q.select().where(q.c.lead_id == CANARY, q.c.state == "queued")).mappings().one()
    assert row["origin"].startswith(origin.format(window=window_of(QUIET, at)))
    if records == 0:
        assert at <= row["not_before"] < at + timedelta(seconds=CANARY_RETRY_S / 10)


def test_a_source_that_fails_and_recovers_is_noticed_on_the_short_interval(store) -> None:
    tick(store, T0 - timedelta(minutes=30))
    collect(store, CANARY, at=T0, records=0)
    tick(store, T0 + timedelta(minutes=1))  # the incident opens
    at = T0 + timedelta(seconds=CANARY_RETRY_S + 60)
    assert tick(store, at).canaries == 1  # the retry, a few minutes on, not 6 h
    collect(store, CANARY, at=at + timedelta(minutes=1), records=3)  # the source answers again
    tick(store, at + timedelta(minutes=2))
    incident = store.source_incident("quiet")
    assert incident is not None and (incident.started_at, incident.ended_at) == (T0, at + timedelta(minutes=1))


def test_a_resting_source_s_failing_canary_waits_in_the_backlog_and_goes_out_as_its_circuit_s_probe(store) -> None:
    tick(store, T0 - timedelta(minutes=30))
    collect(store, CANARY, at=T0, records=0, failed=True)
    circuits = Circuits(store, clock=lambda: T0.timestamp())
    for _ in range(QUIET.circuit.failure_threshold):
        circuits.record("quiet", QUIET.circuit, success=False)
    at = T0 + timedelta(seconds=CANARY_RETRY_S)
    plan = {p.source: p for p in plan_recurring(store, CATALOG, now=at, circuits=circuits)}["quiet"]
    assert plan.skipped == "circuit open" and plan.canaries == 1
    (probe,) = plan_dispatch(store, CATALOG, max_runs=10, now=at + timedelta(minutes=1), circuits=circuits).handovers
    assert probe.lead_ids == [CANARY]
