"""The learned cadence's pure decisions: what a visit says, how fast a lead changes (the MAP of
Cho and Garcia-Molina's irregular-interval likelihood with its source's prior), and when each lead
is looked at again (the square-root rule within the budget and the bounds)."""

from __future__ import annotations

import math

import pytest

from investigations.scheduling.cadence import (
    HISTORY_VISITS,
    ChangeHistory,
    LeadCadence,
    MonitoredLead,
    SourcePlan,
    cadence_scale,
    change_rate,
    estimate_rates,
    lead_weight,
    observe,
    plan_revisits,
    plan_source,
    planned_interval_s,
    prior_rate_per_s,
    recurring_budget_per_s,
    revisit_interval_s,
    says_something,
)
from investigations.sources.specs import parse_sources

H = 3_600.0
DAY = 86_400.0
PRIOR = 1 / (6 * H)


# -- what a visit says ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "records", "counts"),
    [
        ("ok", 3, True),
        ("empty", 0, False),  # the source may be failing silently: says nothing about change
        ("failed", 0, False),  # saw nothing
        ("ok", 0, False),  # never written so, but an answer without records says nothing either
    ],
)
def test_only_a_collection_with_records_is_a_visit(outcome: str, records: int, counts: bool) -> None:
    assert says_something(outcome, records) is counts


@pytest.mark.parametrize(
    ("before", "at_s", "content_hash", "after"),
    [
        # The first answer is only what the next is compared with.
        pytest.param(None, 100.0, "a", ChangeHistory(100.0, "a"), id="first-answer"),
        pytest.param(ChangeHistory(100.0, "a"), 400.0, "a", ChangeHistory(400.0, "a", ((300.0, False),)),
                     id="unchanged"),
        pytest.param(ChangeHistory(100.0, "a", ((50.0, False),)), 400.0, "b",
                     ChangeHistory(400.0, "b", ((50.0, False), (300.0, True))), id="changed"),
        # A clock that went back says nothing.
        pytest.param(ChangeHistory(100.0, "a"), 100.0, "b", ChangeHistory(100.0, "a"), id="same-moment"),
        pytest.param(ChangeHistory(100.0, "a"), 50.0, "b", ChangeHistory(100.0, "a"), id="earlier"),
    ],
)
def test_a_visit_is_compared_with_the_last_answer_which_it_becomes(
    before: ChangeHistory | None, at_s: float, content_hash: str, after: ChangeHistory
) -> None:
    assert observe(before, at_s=at_s, content_hash=content_hash) == after


def test_a_history_keeps_the_last_visits_only() -> None:
    history = ChangeHistory(0.0, "a")
    for n in range(1, HISTORY_VISITS + 6):
        history = observe(history, at_s=n * 10.0, content_hash=str(n % 2))
    assert len(history.visits) == HISTORY_VISITS
    assert history.visits[-1] == (10.0, True) and history.seen_at_s == (HISTORY_VISITS + 5) * 10.0


# -- how fast a lead changes ------------------------------------------------------------------------


def mle(visits: tuple[tuple[float, bool], ...]) -> float:
    """The estimate with a prior of negligible weight: the plain maximum likelihood."""
    return change_rate(visits, PRIOR, 1e-9)


@pytest.mark.parametrize(
    ("visits", "expected"),
    [
        # No visits: the source's prior.
        pytest.param((), PRIOR, id="new-lead"),
        # Nothing changed: one pseudo-change over the prior's interval plus what was seen unchanged.
        pytest.param(((6 * H, False),) * 3, 1 / (24 * H), id="never-changed"),
        pytest.param(((2 * H, False), (10 * H, False)), 1 / (18 * H), id="never-changed-irregular"),
    ],
)
def test_the_rate_with_no_change_seen_is_closed_form(visits: tuple, expected: float) -> None:
    assert change_rate(visits, PRIOR) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("changed", "of"), [(1, 4), (2, 4), (3, 4), (5, 20), (19, 20)])
def test_at_regular_intervals_the_estimate_is_the_known_closed_form(changed: int, of: int) -> None:
    # Σ t/(exp(λt)−1) over the changed visits = Σ t over the unchanged: exp(λt) = n / unchanged.
    visits = ((3 * H, True),) * changed + ((3 * H, False),) * (of - changed)
    assert mle(visits) == pytest.approx(math.log(of / (of - changed)) / (3 * H), rel=1e-6)


def test_the_maximum_likelihood_solves_the_irregular_interval_equation() -> None:
    visits = ((1 * H, True), (5 * H, False), (2 * H, True), (30 * H, True), (12 * H, False), (0.5 * H, False))
    rate = mle(visits)
    changed = sum(t / math.expm1(rate * t) for t, c in visits if c)
    assert changed == pytest.approx(sum(t for t, c in visits if not c), rel=1e-9)


@pytest.mark.parametrize("n", [1, 5, 32])
def test_every_visit_changed_is_still_a_finite_rate_rising_with_the_evidence(n: int) -> None:
    rate = change_rate(((6 * H, True),) * n, PRIOR)
    assert PRIOR < rate < math.inf
    assert change_rate(((6 * H, True),) * (n + 1), PRIOR) > rate


def test_more_changes_mean_a_faster_rate_and_longer_quiet_a_slower_one() -> None:
    base = ((6 * H, False), (6 * H, True), (6 * H, False))
    assert change_rate(((6 * H, True),) + base, PRIOR) > change_rate(base, PRIOR)
    assert change_rate(((60 * H, False),) + base, PRIOR) < change_rate(base, PRIOR)


def test_a_huge_interval_does_not_overflow() -> None:
    assert 0 < change_rate(((1e9, True), (1.0, False)), PRIOR) < math.inf


def test_a_prior_must_be_a_rate() -> None:
    with pytest.raises(ValueError, match="above 0"):
        change_rate((), 0.0)


# -- when to look again -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("score", "scale", "expected"),
    [
        (0.5, 10.0, 20.0),  # c / score
        (10.0, 10.0, 5.0),  # below min: min
        (0.01, 10.0, 100.0),  # above max: max
        (0.0, 10.0, math.inf),  # weighs nothing: never
        (0.5, math.inf, 100.0),  # a budget short of every max: max
        (0.5, 0.0, 5.0),  # a budget for every lead at min: min
    ],
)
def test_a_lead_s_interval_is_the_scale_over_its_score_within_bounds(score: float, scale: float,
                                                                     expected: float) -> None:
    assert revisit_interval_s(score, scale, min_s=5.0, max_s=100.0) == expected


def spend(scores: list[float], scale: float, *, min_s: float, max_s: float) -> float:
    return sum(1 / revisit_interval_s(s, scale, min_s=min_s, max_s=max_s) for s in scores if s > 0)


@pytest.mark.parametrize(
    ("scores", "budget", "scale"),
    [
        # No bound reached: c = Σ score / budget (1 + 2 + 3 = 6 over 0.6 per s: c = 10).
        pytest.param([1.0, 2.0, 3.0], 0.6, 10.0, id="square-root-rule"),
        # Enough for every lead at min (3 every 2 s): c = 0.
        pytest.param([1.0, 2.0, 3.0], 1.5, 0.0, id="every-lead-at-min"),
        # Just short of it: the fastest lead at min exactly (6 / 3 = 2 s), 1/6 + 1/3 + 1/2 = 1.
        pytest.param([1.0, 2.0, 3.0], 1.0, 6.0, id="fastest-just-at-min"),
        # Not enough for every lead at max (3 / 100 > 0.02): inf, all at max.
        pytest.param([1.0, 2.0, 3.0], 0.02, math.inf, id="short-of-max"),
        # The fast lead pinned at min (1/2 per s), the others share the rest: (0.1 + 0.2) / (0.55 − 0.5).
        pytest.param([0.1, 0.2, 100.0], 0.55, 6.0, id="fastest-at-min"),
        # The slow lead pinned at max (1/100 per s), the others: (3 + 4) / (0.1 − 0.01) = 77.8.
        pytest.param([0.001, 3.0, 4.0], 0.1, 7 / 0.09, id="slowest-at-max"),
        # Leads weighing nothing take no budget.
        pytest.param([0.0, 1.0, 2.0, 3.0], 0.6, 10.0, id="zero-scores-ignored"),
        pytest.param([], 0.6, 0.0, id="no-leads"),
    ],
)
def test_the_scale_spends_the_budget_exactly(scores: list[float], budget: float, scale: float) -> None:
    found = cadence_scale(scores, min_s=2.0, max_s=100.0, budget_per_s=budget)
    assert found == pytest.approx(scale, rel=1e-12)
    if 0 < found < math.inf:
        assert spend(scores, found, min_s=2.0, max_s=100.0) == pytest.approx(budget, rel=1e-12)


def test_the_scale_is_exact_on_many_leads_at_both_bounds() -> None:
    scores = [math.sqrt(1 / (2 ** (k / 3) * H)) for k in range(60)]  # rates from hourly to ~a million hours
    for budget in (0.4 / H, 2 / H, 10 / H, 40 / H):
        scale = cadence_scale(scores, min_s=H, max_s=30 * DAY, budget_per_s=budget)
        assert spend(scores, scale, min_s=H, max_s=30 * DAY) == pytest.approx(budget, rel=1e-9)


def leads(*rates: float, last_at_s: float = 0.0) -> list[LeadCadence]:
    return [LeadCadence(f"lead-{n}", last_at_s, rate) for n, rate in enumerate(rates)]


def test_a_lead_changing_four_times_as_often_is_looked_at_twice_as_often() -> None:
    plan = plan_revisits(leads(4 / DAY, 1 / DAY), now_s=0.0, min_s=60.0, max_s=30 * DAY, budget_per_s=3 / DAY)
    assert plan.intervals_s == pytest.approx((DAY / 2, DAY))
    assert plan.spend_per_s == pytest.approx(3 / DAY) and not plan.short


@pytest.mark.parametrize(
    ("now_s", "due"),
    [
        (0.0, []),
        (DAY / 2, ["lead-0"]),  # the fast lead's interval has passed
        (DAY, ["lead-0", "lead-1"]),  # earliest due first
    ],
)
def test_leads_are_due_when_their_interval_has_passed_earliest_first(now_s: float, due: list[str]) -> None:
    plan = plan_revisits(leads(4 / DAY, 1 / DAY), now_s=now_s, min_s=60.0, max_s=30 * DAY, budget_per_s=3 / DAY)
    assert plan.due == due


def test_a_waiting_lead_is_planned_for_but_not_due_again() -> None:
    waiting = [LeadCadence("lead-0", 0.0, 4 / DAY, waiting=True), LeadCadence("lead-1", 0.0, 1 / DAY)]
    plan = plan_revisits(waiting, now_s=DAY, min_s=60.0, max_s=30 * DAY, budget_per_s=3 / DAY)
    assert plan.due == ["lead-1"] and plan.intervals_s == pytest.approx((DAY / 2, DAY))


def test_a_heavier_lead_is_looked_at_as_often_as_a_faster_one() -> None:
    weighted = [LeadCadence("open", 0.0, 1 / DAY, weight=1.0), LeadCadence("closed", 0.0, 1 / DAY, weight=0.25),
                LeadCadence("ignored", 0.0, 1 / DAY, weight=0.0)]
    plan = plan_revisits(weighted, now_s=0.0, min_s=60.0, max_s=30 * DAY, budget_per_s=3 / DAY)
    assert plan.intervals_s == pytest.approx((DAY / 2, DAY))  # the lead weighing nothing is never planned


def test_a_fixed_cadence_is_every_lead_alike_whatever_its_rate_or_the_budget() -> None:
    plan = plan_revisits(leads(10 / H, 1 / DAY, 1e-9, last_at_s=-6 * H), now_s=0.0, min_s=6 * H, max_s=6 * H,
                         budget_per_s=1e-12)
    assert plan.due == ["lead-0", "lead-1", "lead-2"] and plan.intervals_s == (6 * H,) * 3 and not plan.short


def test_a_budget_short_of_the_max_keeps_every_lead_at_max_and_says_so() -> None:
    plan = plan_revisits(leads(1 / H, 1 / DAY), now_s=0.0, min_s=H, max_s=DAY, budget_per_s=1 / (10 * DAY))
    assert plan.short and plan.intervals_s == (DAY, DAY) and plan.median_interval_s == DAY


def test_the_plan_is_the_same_for_the_same_inputs() -> None:
    rates = [1 / (k * H) for k in range(1, 50)]
    first = plan_revisits(leads(*rates), now_s=20 * H, min_s=H, max_s=30 * DAY, budget_per_s=10 / DAY)
    assert first == plan_revisits(leads(*rates), now_s=20 * H, min_s=H, max_s=30 * DAY, budget_per_s=10 / DAY)


# -- a source's settings ----------------------------------------------------------------------------

CATALOG = parse_sources("""
sources:
  - name: learned
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://learned.example/api?q={value}"}
    rate: {source_per_s: 0.01}
    recrawl: {min: 1h, max: 30d, every: 6h, share: 0.5, closed_weight: 0.25}
  - name: priced
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://priced.example/api?q={value}"}
    rate: {source_per_s: 10}
    recrawl: {min: 1h, max: 30d, every: 1h}
    daily_budget_usd: 8.64
    cost_per_request_usd: 0.001
  - name: fixed
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://fixed.example/api?q={value}"}
    recrawl_every: 12h
""")


@pytest.mark.parametrize(
    ("source", "weight", "budget"),
    [
        # What the fixed cadence `every` would spend: 10 leads every 6 h.
        ("learned", 10.0, 10 / (6 * H)),
        # ... within half its rate (0.005 per s = 18 per hour, below 1000 leads every 6 h).
        ("learned", 1000.0, 0.005),
        # ... and what its daily budget buys: 8.64 USD at 0.001 a request, 8640 a day (0.1 per s).
        ("priced", 1000.0, 0.1),
        ("priced", 100.0, 100 / H),
        ("fixed", 12.0, 1 / H),
    ],
)
def test_a_source_s_budget_is_its_every_within_its_rate_share_and_money(source: str, weight: float,
                                                                       budget: float) -> None:
    assert recurring_budget_per_s(CATALOG.get(source), total_weight=weight) == pytest.approx(budget)


def test_a_source_s_prior_and_lead_weights() -> None:
    learned, fixed = CATALOG.get("learned"), CATALOG.get("fixed")
    assert prior_rate_per_s(learned) == pytest.approx(1 / (6 * H)) and prior_rate_per_s(fixed) == 1 / (12 * H)
    assert (lead_weight(learned, open_case=True), lead_weight(learned, open_case=False)) == (1.0, 0.25)
    assert lead_weight(fixed, open_case=False) == 0.0  # closing a case stops monitoring, by default


def test_a_kept_rate_is_used_and_a_missing_one_estimated_from_the_visits() -> None:
    kept = MonitoredLead("kept", 0.0, rate_per_s=1 / H)
    seen = MonitoredLead("seen", 0.0, visits=((6 * H, False),) * 3)
    new = MonitoredLead("new", 0.0)
    filled, estimated = estimate_rates([kept, seen, new], PRIOR)
    assert [lead.rate_per_s for lead in filled] == [1 / H, pytest.approx(1 / (24 * H)), PRIOR]
    assert estimated == {"seen": pytest.approx(1 / (24 * H))}  # a lead with no visits has only the prior to keep


def test_a_source_s_plan_weighs_its_leads_by_their_cases_within_its_budget() -> None:
    learned = CATALOG.get("learned")  # every 6 h, closed leads at a quarter
    monitored = [MonitoredLead("open", 0.0, rate_per_s=1 / DAY), MonitoredLead("closed", 0.0, rate_per_s=1 / DAY,
                                                                                  open_case=False)]
    plan = plan_source(learned, monitored, now_s=0.0)
    assert plan.spend_per_s == pytest.approx(1.25 / (6 * H)) and plan.intervals_s[1] == pytest.approx(
        2 * plan.intervals_s[0])


def test_one_lead_s_interval_under_its_source_s_last_plan_is_the_interval_that_plan_gave_it() -> None:
    learned = CATALOG.get("learned")
    monitored = [MonitoredLead(f"l{i}", 0.0, rate_per_s=rate, open_case=i % 2 == 0)
                 for i, rate in enumerate((1 / H, 1 / DAY, 1 / (30 * DAY), 4 / DAY))]
    plan = plan_source(learned, monitored, now_s=0.0)
    kept = SourcePlan(plan.scale, plan.short)
    alone = {lead.lead_id: planned_interval_s(learned, rate_per_s=lead.rate_per_s or 0.0, open_case=lead.open_case,
                                              plan=kept) for lead in monitored}
    assert alone == pytest.approx(dict(plan.by_lead))


@pytest.mark.parametrize(
    ("source", "rate_per_s", "open_case", "plan", "interval_s"),
    [
        # A fixed cadence needs no plan: every lead every `min`, whatever its rate.
        ("fixed", 1 / H, True, None, 12 * H),
        ("fixed", 1 / H, True, SourcePlan(1.0), 12 * H),
        ("fixed", 1 / H, False, None, math.inf),  # only closed cases hold it: not collected again
        # Not planned yet: as if every lead changed at the prior, a lead at the prior every `every` ...
        ("learned", PRIOR, True, None, 6 * H),
        # ... and one changing 4 times as often twice as often.
        ("learned", 4 * PRIOR, True, None, 3 * H),
        # A short budget's plan (c infinite): every lead at its max.
        ("learned", 4 * PRIOR, True, SourcePlan(math.inf, short=True), 30 * DAY),
    ],
)
def test_one_lead_s_interval_needs_no_plan_on_a_fixed_cadence_and_reads_a_prior_plan_before_the_first(
    source: str, rate_per_s: float, open_case: bool, plan: SourcePlan | None, interval_s: float
) -> None:
    found = planned_interval_s(CATALOG.get(source), rate_per_s=rate_per_s, open_case=open_case, plan=plan)
    assert found == pytest.approx(interval_s)

