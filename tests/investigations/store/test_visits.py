"""Change histories in the state store, on SQLite and on Postgres: each collection with records is a
visit of its lead, written in the collection's transaction; the planner reads every monitored lead
with its visits."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from investigations.intake.leads import normalize_lead
from investigations.scheduling.cadence import HISTORY_VISITS, ChangeHistory, SourcePlan, change_rate
from investigations.store import StateStore
from investigations.store.visits import decode_visits, encode_visits

T0 = datetime(2026, 12, 1, tzinfo=UTC)
PRIOR_S = 6 * 3600.0
LEAD = normalize_lead("domain", "changing.example")


def collect(store: StateStore, *, at: datetime, outcome: str = "ok", records: int = 3, content_hash: str | None = "a",
            lead_id: str = LEAD.id, source: str = "robust", prior_s: float | None = None) -> None:
    store.complete_collection(source=source, lead_id=lead_id, outcome=outcome, records=records,
                              content_hash=None if outcome == "failed" else content_hash,
                              path=None if outcome == "failed" else "/p", run_id="r", now=at, change_prior_s=prior_s)


def hours(n: float) -> datetime:
    return T0 + timedelta(hours=n)


def test_the_first_answer_with_records_is_what_the_next_is_compared_with(store: StateStore) -> None:
    assert store.change_history("robust", LEAD.id) is None
    collect(store, at=T0)
    assert store.change_history("robust", LEAD.id) == ChangeHistory(T0.timestamp(), "a")


def test_each_answer_with_records_is_a_visit_changed_or_not(store: StateStore) -> None:
    collect(store, at=T0, content_hash="a")
    collect(store, at=hours(6), content_hash="a")
    collect(store, at=hours(18), content_hash="b")
    history = store.change_history("robust", LEAD.id)
    assert history == ChangeHistory(hours(18).timestamp(), "b", ((6 * 3600.0, False), (12 * 3600.0, True)))


@pytest.mark.parametrize(
    ("outcome", "records"),
    [
        ("empty", 0),  # the source may be failing silently
        ("failed", 0),  # saw nothing
    ],
)
def test_empty_and_failed_collections_say_nothing_and_the_next_is_compared_across_them(
    store: StateStore, outcome: str, records: int
) -> None:
    collect(store, at=T0, content_hash="a")
    collect(store, at=hours(6), outcome=outcome, records=records, content_hash="empty-hash")
    assert store.change_history("robust", LEAD.id) == ChangeHistory(T0.timestamp(), "a")
    collect(store, at=hours(12), content_hash="a")
    history = store.change_history("robust", LEAD.id)
    assert history is not None and history.visits == ((12 * 3600.0, False),)  # from the last answer with records


def test_an_empty_first_answer_is_not_an_answer_to_compare_with(store: StateStore) -> None:
    collect(store, at=T0, outcome="empty", records=0, content_hash="empty-hash")
    assert store.change_history("robust", LEAD.id) is None


def test_a_history_keeps_its_last_visits_per_source(store: StateStore) -> None:
    for n in range(HISTORY_VISITS + 3):
        collect(store, at=hours(n), content_hash=str(n % 3 == 0))
    collect(store, at=hours(1), source="fragile")
    history = store.change_history("robust", LEAD.id)
    assert history is not None and len(history.visits) == HISTORY_VISITS
    assert store.change_history("fragile", LEAD.id) == ChangeHistory(hours(1).timestamp(), "a")


def test_the_planner_reads_every_monitored_lead_with_its_flags_and_visits(store: StateStore) -> None:
    open_lead, closed_lead, dead_lead, waiting_lead = (
        normalize_lead("domain", f"{name}.example") for name in ("open", "closed", "dead", "waiting"))
    other_kind = normalize_lead("username", "someone")
    for lead in (open_lead, dead_lead, waiting_lead):
        store.add_lead(lead, case_id="case-open", now=T0)
    store.add_lead(closed_lead, case_id="case-closed", now=T0)
    store.set_case_status("case-closed", "closed")
    store.add_lead(other_kind, case_id="case-open", now=T0)
    store.add_lead(normalize_lead("domain", "never-collected.example"), case_id="case-open", now=T0)
    for lead in (open_lead, closed_lead, dead_lead, waiting_lead, other_kind):
        collect(store, at=T0, lead_id=lead.id)
    collect(store, at=hours(2), lead_id=open_lead.id, content_hash="b")
    store.put_dead_letter(source="robust", lead_id=dead_lead.id, reason_group="transient", last_status=500,
                          attempts=4, last_error="HTTP 500", now=hours(1))
    store.enqueue([("robust", waiting_lead.id)], origin="recurring:1", priority_class="recurring", now=hours(1))
    rows = {row.lead_id: row for row in store.cadence_leads("robust", lead_kinds=["domain"], prior_s=PRIOR_S)}
    assert set(rows) == {open_lead.id, waiting_lead.id}  # not closed-only, dead-lettered, other kinds or never collected
    assert (rows[open_lead.id].last_at_s, rows[open_lead.id].open_case, rows[open_lead.id].waiting) == (
        hours(2).timestamp(), True, False)
    assert rows[open_lead.id].visits == ((7200.0, True),) and rows[open_lead.id].rate_per_s is None
    assert rows[waiting_lead.id].waiting and rows[waiting_lead.id].visits == ()
    closed_too = {row.lead_id: row.open_case
                  for row in store.cadence_leads("robust", lead_kinds=["domain"], prior_s=PRIOR_S, closed_too=True)}
    assert closed_too == {open_lead.id: True, waiting_lead.id: True, closed_lead.id: False}


@pytest.mark.parametrize(
    "visits",
    [(), ((3600.0, True),), ((0.001, False), (2_592_000.0, True), (1234.567, False))],
)
def test_visits_read_back_as_written(visits: tuple[tuple[float, bool], ...]) -> None:
    assert decode_visits(encode_visits(visits)) == visits


def test_a_visit_keeps_its_lead_s_rate_for_its_source_s_prior_and_the_planner_reads_it(store: StateStore) -> None:
    store.add_lead(LEAD, case_id="case-open", now=T0)
    collect(store, at=T0, prior_s=PRIOR_S)
    collect(store, at=hours(6), content_hash="b", prior_s=PRIOR_S)
    (row,) = store.cadence_leads("robust", lead_kinds=["domain"], prior_s=PRIOR_S)
    assert row.rate_per_s == change_rate(((6 * 3600.0, True),), 1 / PRIOR_S) and row.visits == ()
    # The source's prior changed since: its visits, to estimate from; kept, the next pass reads the rate.
    (row,) = store.cadence_leads("robust", lead_kinds=["domain"], prior_s=2 * PRIOR_S)
    assert row.rate_per_s is None and row.visits == ((6 * 3600.0, True),)
    store.keep_change_rates("robust", {LEAD.id: 1e-5}, prior_s=2 * PRIOR_S)
    (row,) = store.cadence_leads("robust", lead_kinds=["domain"], prior_s=2 * PRIOR_S)
    assert row.rate_per_s == 1e-5
    store.keep_change_rates("robust", {}, prior_s=PRIOR_S)  # nothing to keep: nothing written



@pytest.mark.parametrize("plan", [SourcePlan(1234.5), SourcePlan(math.inf, short=True), SourcePlan(0.0)])
def test_a_source_s_last_plan_reads_back_as_kept_and_a_later_one_replaces_it(store: StateStore,
                                                                            plan: SourcePlan) -> None:
    assert store.cadence_plan("robust") is None  # not planned yet
    store.keep_cadence_plan("robust", SourcePlan(99.0), now=T0)
    store.keep_cadence_plan("robust", plan, now=hours(1))
    assert store.cadence_plan("robust") == plan and store.cadence_plan("fragile") is None


def test_one_collected_lead_reads_with_its_cases_dead_letter_and_its_source_s_plan(store: StateStore) -> None:
    held, loose = LEAD, normalize_lead("domain", "loose.example")
    store.add_lead(held, case_id="case-closed", now=T0)
    store.set_case_status("case-closed", "closed")
    store.add_lead(loose, now=T0)  # no case holds it
    collect(store, at=T0, lead_id=held.id, prior_s=PRIOR_S)
    collect(store, at=hours(6), lead_id=held.id, content_hash="b", prior_s=PRIOR_S)
    collect(store, at=hours(1), lead_id=loose.id, outcome="empty", records=0)
    store.put_dead_letter(source="robust", lead_id=loose.id, reason_group="transient", last_status=500,
                          attempts=4, last_error="HTTP 500", now=hours(2))
    store.keep_cadence_plan("robust", SourcePlan(500.0, short=True), now=hours(6))
    known = store.planned_lead("robust", held.id, prior_s=PRIOR_S)
    assert known is not None and known.plan == SourcePlan(500.0, short=True)
    assert (known.lead.last_at_s, known.lead.open_case, known.in_case, known.dead_letter) == (
        hours(6).timestamp(), False, True, False)
    assert known.lead.rate_per_s == change_rate(((6 * 3600.0, True),), 1 / PRIOR_S)
    assert (known.outcome, known.records) == ("ok", 3)
    store.set_case_status("case-closed", "active")
    reopened = store.planned_lead("robust", held.id, prior_s=PRIOR_S)
    assert reopened is not None and reopened.lead.open_case
    # Another prior: the visits, to estimate from.
    other = store.planned_lead("robust", held.id, prior_s=2 * PRIOR_S)
    assert other is not None and other.lead.rate_per_s is None and other.lead.visits == ((6 * 3600.0, True),)
    loose_known = store.planned_lead("robust", loose.id, prior_s=PRIOR_S)
    assert loose_known is not None and (loose_known.in_case, loose_known.dead_letter, loose_known.outcome) == (
        False, True, "empty")
    assert loose_known.lead.rate_per_s is None and loose_known.lead.visits == ()  # an empty answer is no visit
    assert store.planned_lead("fragile", held.id, prior_s=PRIOR_S) is None  # never collected there

