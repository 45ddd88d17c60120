"""The recurring planner on a learned cadence (`recrawl: {min, max}`): each monitored lead is due
when the interval its history earned has passed, within its source's budget and bounds; a source
on the old fixed `recrawl_every` is planned as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from investigations.intake.leads import normalize_lead
from investigations.scheduling.cadence import change_rate, prior_rate_per_s
from investigations.scheduling.dispatch import due_leads, plan_cadence, plan_recurring, window_of
from investigations.sources.specs import parse_sources
from investigations.store import StateStore
from investigations.store import schema as s

T0 = datetime(2026, 12, 1, tzinfo=UTC)
H = 3_600.0
CATALOG = parse_sources("""
sources:
  - name: learned
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://learned.example/api?q={value}"}
    rate: {source_per_s: 5}
    recrawl: {min: 1h, max: 30d, every: 6h, closed_weight: 0.25}
  - name: fixed
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://fixed.example/api?q={value}"}
    rate: {source_per_s: 5}
    recrawl_every: 6h
""")
LEARNED, FIXED = CATALOG.get("learned"), CATALOG.get("fixed")


def lead(store: StateStore, value: str, *, case: str = "case-open") -> str:
    found = normalize_lead("domain", value)
    store.add_lead(found, case_id=case, now=T0 - timedelta(days=30))
    return found.id


def history(store: StateStore, lead_id: str, *, changes: bool, visits: int = 12, source: str = "learned") -> datetime:
    """`visits` + 1 collections 6 h apart up to T0, each a change or none; returns the last."""
    for n in range(visits + 1):
        at = T0 - timedelta(hours=6 * (visits - n))
        store.complete_collection(source=source, lead_id=lead_id, outcome="ok", records=3,
                                  content_hash=str(n) if changes else "same", path="/p", run_id="r", now=at)
    return T0


def visits(store: StateStore, lead_id: str) -> tuple:
    history = store.change_history("learned", lead_id)
    assert history is not None
    return history.visits


@pytest.fixture
def store(sqlite_store: StateStore) -> StateStore:
    return sqlite_store


def learned_plan(store: StateStore, at: datetime):
    return {plan.source: plan for plan in plan_recurring(store, CATALOG, now=at)}["learned"]


def test_a_lead_that_keeps_changing_is_due_long_before_one_that_never_does(store: StateStore) -> None:
    fast, still = lead(store, "fast.example"), lead(store, "still.example")
    history(store, fast, changes=True)
    history(store, still, changes=False)
    plan = plan_cadence(store, LEARNED, now=T0)
    fast_s, still_s = plan.intervals_s
    assert LEARNED.recrawl.min_s <= fast_s < 6 * H < still_s <= LEARNED.recrawl.max_s
    # The square-root rule: the intervals are in the inverse ratio of the rates' square roots.
    fast_rate, still_rate = (change_rate(visits(store, lead_id), prior_rate_per_s(LEARNED)) for lead_id in (fast, still))
    assert still_s / fast_s == pytest.approx((fast_rate / still_rate) ** 0.5)
    assert due_leads(store, LEARNED, now=T0 + timedelta(seconds=fast_s - 60))[0] == []
    assert due_leads(store, LEARNED, now=T0 + timedelta(seconds=fast_s + 60))[0] == [fast]
    assert due_leads(store, LEARNED, now=T0 + timedelta(seconds=still_s + 60))[0] == [fast, still]  # earliest first


def test_the_plan_spends_what_the_fixed_cadence_every_would(store: StateStore) -> None:
    leads = [lead(store, f"lead{n}.example") for n in range(4)]
    for n, lead_id in enumerate(leads):
        history(store, lead_id, changes=n % 2 == 0)
    plan = plan_cadence(store, LEARNED, now=T0)
    assert plan.spend_per_s == pytest.approx(4 / (6 * H)) and not plan.short


def test_due_leads_are_queued_once_per_window_of_the_shortest_interval(store: StateStore) -> None:
    fast = lead(store, "fast.example")
    history(store, fast, changes=True)
    at = T0 + timedelta(seconds=plan_cadence(store, LEARNED, now=T0).intervals_s[0] + 60)
    first = learned_plan(store, at)
    assert (first.due, first.queued, first.window) == (1, 1, window_of(LEARNED, at))
    assert first.window == int(at.timestamp() // H) and first.median_interval_s is not None
    again = learned_plan(store, at + timedelta(minutes=1))
    assert (again.due, again.queued) == (0, 0)  # waiting in the backlog: planned for, not due again
    q = s.collection_queue
    with store.engine.begin() as conn:
        origins = list(conn.scalars(q.select().with_only_columns(q.c.origin).where(q.c.source == "learned")))
    assert origins == [f"recurring:{first.window}"]


def test_a_new_lead_starts_from_its_source_s_prior(store: StateStore) -> None:
    new = lead(store, "new.example")
    store.complete_collection(source="learned", lead_id=new, outcome="ok", records=3, content_hash="h", path="/p",
                              run_id="r", now=T0)
    (interval,) = plan_cadence(store, LEARNED, now=T0).intervals_s
    assert interval == pytest.approx(6 * H)  # alone, at its prior, within a budget of one lead every 6 h


def test_a_lead_only_closed_cases_hold_weighs_less_than_an_open_one(store: StateStore) -> None:
    open_lead, closed_lead = lead(store, "open.example"), lead(store, "closed.example", case="case-closed")
    store.set_case_status("case-closed", "closed")
    for lead_id in (open_lead, closed_lead):
        history(store, lead_id, changes=True)
    plan = plan_cadence(store, LEARNED, now=T0)
    open_s, closed_s = plan.intervals_s
    assert closed_s / open_s == pytest.approx(2.0)  # weight 0.25: its score is half
    assert plan.spend_per_s == pytest.approx(1.25 / (6 * H))  # the budget counts it at its weight


def test_a_fixed_source_is_planned_as_before_whatever_its_leads_history(store: StateStore) -> None:
    fast, still = lead(store, "fast.example"), lead(store, "still.example")
    history(store, fast, changes=True, source="fixed")
    history(store, still, changes=False, source="fixed")
    assert due_leads(store, FIXED, now=T0 + timedelta(hours=6))[0] == []
    due, plan = due_leads(store, FIXED, now=T0 + timedelta(hours=6, seconds=1))
    assert sorted(due) == sorted([fast, still]) and plan is None
    fixed = {p.source: p for p in plan_recurring(store, CATALOG, now=T0 + timedelta(hours=7))}["fixed"]
    assert (fixed.due, fixed.median_interval_s, fixed.budget_short) == (2, None, False)


def test_a_budget_short_of_every_lead_s_max_is_said(store: StateStore) -> None:
    catalog = parse_sources("""
sources:
  - name: learned
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://learned.example/api?q={value}"}
    rate: {source_per_s: 0.000001}
    recrawl: {min: 1h, max: 30d, every: 6h, share: 0.5}
""")
    for n in range(3):
        history(store, lead(store, f"lead{n}.example"), changes=True, visits=2)
    (plan,) = plan_recurring(store, catalog, now=T0 + timedelta(days=31))
    assert plan.budget_short and plan.median_interval_s == 30 * 86_400.0 and plan.due == 3


def test_rates_kept_with_the_visits_are_used_and_those_of_another_prior_estimated_again_and_kept(
    store: StateStore
) -> None:
    fast = lead(store, "fast.example")
    history(store, fast, changes=True)  # collected without a prior: the planner estimates, and keeps
    plan = plan_cadence(store, LEARNED, now=T0)
    (row,) = store.cadence_leads("learned", lead_kinds=["domain"], prior_s=LEARNED.recrawl.prior_s)
    assert row.rate_per_s == change_rate(visits(store, fast), prior_rate_per_s(LEARNED))
    assert plan_cadence(store, LEARNED, now=T0) == plan  # read back, the same plan
    # A collection with its source's prior keeps the rate itself, as the collector's store step does.
    store.complete_collection(source="learned", lead_id=fast, outcome="ok", records=3, content_hash="again",
                              path="/p", run_id="r", now=T0 + timedelta(hours=1), change_prior_s=LEARNED.recrawl.prior_s)
    (row,) = store.cadence_leads("learned", lead_kinds=["domain"], prior_s=LEARNED.recrawl.prior_s)
    assert row.rate_per_s == change_rate(visits(store, fast), prior_rate_per_s(LEARNED))
