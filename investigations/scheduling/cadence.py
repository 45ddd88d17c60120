"""Recurring crawls on the cadence each lead has earned: how fast its answer changes, and when to look again.

Three pure steps, each a function of its inputs only (times are epoch seconds, passed in):

1. **What a visit says** (`observe`). Each (source, lead) keeps its last answer with records (when,
   and its content hash) and its last HISTORY_VISITS visits as (seconds since that answer, changed:
   the content hash differs). Only a collection that found records is a visit (`says_something`):
   an empty answer may be the source failing silently and a failed one saw nothing, so neither
   says anything about change, and neither moves the answer the next visit is compared with. The
   first answer with records is only that: the one the next is compared with.
2. **How fast it changes** (`change_rate`). Changes are a Poisson process of rate λ, seen only as
   "changed or not since the last visit", at irregular intervals: a visit t seconds after the last
   saw no change with probability exp(-λt). The estimate is the maximum a posteriori of λ (Cho and
   Garcia-Molina, "Estimating frequency of change", ACM TOIT 2003, for irregular intervals, with
   their small-sample correction made a prior): with a Gamma prior of shape 1 + κ and rate κ/λ₀
   (its mode λ₀, the source's prior, worth κ = PRIOR_STRENGTH changes seen over 1/λ₀), it is the
   root of

       Σ_changed t_i / (exp(λ t_i) − 1) + κ/λ  =  Σ_unchanged t_j + κ/λ₀

   which is unique (the left side falls from +∞ to 0) and is finite when every visit saw a change
   and above 0 when none did. A lead with no visits yet has the prior's rate λ₀.
3. **When to look again** (`plan_revisits`). A change caught I seconds after the last visit waits
   I/2 on average, so lead i with weight w_i (1 in an open case, the source's `closed_weight` in
   closed ones only) costs w_i λ_i I_i / 2 seconds of detection delay per second. The plan
   minimises their sum for a number of collections per second, the budget B
   (`recurring_budget_per_s`): what the fixed cadence `every` would spend (Σ w_i / every), within
   the share of the source's rate left to recurring work and what its daily budget buys. The
   Lagrange condition gives each lead the square-root rule

       I_i = clamp(c / √(w_i λ_i), min, max),    c such that Σ 1 / I_i = B

   so one more collection saves the same weighted delay (w_i λ_i I_i² / 2) whichever lead it goes
   to, bounds aside: a lead changing 4 times as often is looked at twice as often. Why delay and not
   Cho and Garcia-Molina's freshness optimum: that one starves the leads changing faster than the
   budget can follow (they are stale anyway), which are the leads an investigator wants seen first.
   A lead of weight 0 is never due; a budget too small for every lead's `max` leaves them all at
   `max` (the bound wins, and the plan says the budget is short). With min = max (a fixed
   `recrawl_every`) every lead is due every `min`, whatever its history: the old fixed cadence.

The fleet runs these in `investigations.scheduling.dispatch.plan_recurring`. The store keeps each
history and the rate estimated at its last visit for its source's prior
(`investigations.store.visits`), so a planning pass reads a rate per lead and estimates only the
leads whose prior changed since (then keeps those), and each source's last plan (its scale c), so
a lead's next visit is worked out alone (`planned_interval_s`) as it is stored; `bench.cadence` runs
the same functions on a simulated clock.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate

from investigations.sources.specs import SourceSpec

# Visits kept per (source, lead): enough for a rate to show (a lead seen 32 times unchanged), few
# enough that a lead whose pace changes is followed within as many visits.
HISTORY_VISITS = 32
# How much the source's prior weighs against a lead's own visits: as much as one change seen over
# the prior's mean interval.
PRIOR_STRENGTH = 1.0
# Leads of an open case weigh this much; a lead only closed cases hold weighs its source's
# `recrawl.closed_weight` (0 by default: closing a case stops monitoring its leads).
OPEN_WEIGHT = 1.0
# Newton's method from below converges in a few steps; this bounds it whatever the input.
_MAX_STEPS = 100
# exp(x) for x above this overflows a float; such a term is 0 to double precision anyway.
_EXP_LIMIT = 700.0

Visit = tuple[float, bool]  # (seconds since the answer before, changed)


@dataclass(frozen=True)
class ChangeHistory:
    """What the estimator keeps of one (source, lead): its last answer with records (when, and its
    content hash) and its last visits, oldest first."""

    seen_at_s: float
    seen_hash: str
    visits: tuple[Visit, ...] = ()


def says_something(outcome: str, records: int) -> bool:
    """Whether a collection counts as a visit: it found records (see the module's docstring)."""
    return outcome == "ok" and records > 0


def observe(history: ChangeHistory | None, *, at_s: float, content_hash: str,
            keep: int = HISTORY_VISITS) -> ChangeHistory:
    """The history after an answer with records at `at_s`: a visit (its interval, changed or not)
    compared with the last answer, which this one becomes. An answer no later than the last one
    (a clock that went back) says nothing."""
    if history is None:
        return ChangeHistory(at_s, content_hash)
    interval_s = at_s - history.seen_at_s
    if interval_s <= 0:
        return history
    visits = (*history.visits, (interval_s, content_hash != history.seen_hash))[-keep:]
    return ChangeHistory(at_s, content_hash, visits)


def change_rate(visits: Sequence[Visit], prior_rate_per_s: float, strength: float = PRIOR_STRENGTH) -> float:
    """The estimated changes per second of a lead from its visits (the MAP of the module's
    docstring)."""
    if prior_rate_per_s <= 0 or strength <= 0:
        raise ValueError("the prior's rate and strength must be above 0")
    exposure_s = sum(t for t, changed in visits if not changed) + strength / prior_rate_per_s
    changed_s = [t for t, changed in visits if changed]
    rate = strength / exposure_s  # the root when nothing changed; below it otherwise
    if not changed_s:
        return rate
    # The left side minus the right is convex and falling: Newton's steps from below stay below
    # the root and rise to it.
    for _ in range(_MAX_STEPS):
        value, slope = _score(rate, changed_s, exposure_s, strength)
        following = rate - value / slope
        if following <= rate * (1 + 1e-12):
            break
        rate = following
    return rate


def _score(rate: float, changed_s: Sequence[float], exposure_s: float, strength: float) -> tuple[float, float]:
    """The MAP equation's left side minus its right at `rate`, and its derivative."""
    value, slope = strength / rate - exposure_s, -strength / (rate * rate)
    for t in changed_s:
        x = rate * t
        if x < _EXP_LIMIT:
            grown = math.expm1(x)
            value += t / grown
            slope -= t * t / (grown * -math.expm1(-x))
    return value, slope


# -- the plan -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeadCadence:
    """One monitored lead as the planner sees it: when it was last collected, how fast it changes,
    what it weighs, and whether a collection of it is already waiting or running (then it is
    planned for, as it spends the budget too, but not due again)."""

    lead_id: str
    last_at_s: float
    rate_per_s: float
    weight: float = OPEN_WEIGHT
    waiting: bool = False


@dataclass(frozen=True)
class RevisitPlan:
    """What one planning pass decided for a source: the leads due now (earliest due first), the
    cadence scale c, the collections per second it plans for, and whether the budget was short of
    keeping every lead within `max`."""

    due: list[str]
    scale: float
    spend_per_s: float
    short: bool = False
    intervals_s: tuple[float, ...] = ()  # every planned lead's interval, ascending
    by_lead: Mapping[str, float] = field(default_factory=dict)  # each lead's interval (inf: never)

    @property
    def median_interval_s(self) -> float | None:
        return statistics.median(self.intervals_s) if self.intervals_s else None


def revisit_interval_s(score: float, scale: float, *, min_s: float, max_s: float) -> float:
    """A lead's interval from its score √(w λ) and the scale c: c / score within [min, max]; never
    (inf) for a score of 0 (a lead that weighs nothing)."""
    if score <= 0:
        return math.inf
    if scale == math.inf:
        return max_s
    return min(max_s, max(min_s, scale / score))


def cadence_scale(scores: Sequence[float], *, min_s: float, max_s: float, budget_per_s: float) -> float:
    """The smallest c whose intervals (`revisit_interval_s`) cost at most `budget_per_s` collections
    per second: 0 when the budget pays for every lead at `min`, inf when it cannot pay for every
    lead at `max`. Exact: the cost is a sum of clamped c/score terms, linear in 1/c between the
    points where a lead reaches a bound, so the crossing is found among those and solved."""
    ordered = sorted(score for score in scores if score > 0)
    if not ordered:
        return 0.0
    load = _Load(ordered, min_s=min_s, max_s=max_s)
    if load.at(0.0) <= budget_per_s:
        return 0.0
    if len(ordered) / max_s > budget_per_s:
        return math.inf
    # Where each lead leaves `min` (c = score × min) and reaches `max` (c = score × max); the cost
    # falls as c grows, so the last point still over the budget starts the segment that crosses it.
    points = sorted({score * bound for score in ordered for bound in (min_s, max_s)})
    low, high = 0, len(points) - 1  # cost(points[high]) = n / max <= budget
    while high - low > 1:
        middle = (low + high) // 2
        if load.at(points[middle]) > budget_per_s:
            low = middle
        else:
            high = middle
    return load.solve(points[low], points[high], budget_per_s)


class _Load:
    """Collections per second of a set of scores at a scale c: Σ clamp(score / c, 1/max, 1/min),
    in O(log n) from the sorted scores and their prefix sums."""

    def __init__(self, ordered: list[float], *, min_s: float, max_s: float) -> None:
        self.ordered, self.min_s, self.max_s = ordered, min_s, max_s
        self.prefix = [0.0, *accumulate(ordered)]

    def parts(self, scale: float) -> tuple[int, float, int]:
        """How many leads are at `min` (score >= c / min), the sum of the scores in between, and
        how many are at `max` (score <= c / max)."""
        at_max = bisect_right(self.ordered, scale / self.max_s)
        at_min_from = bisect_left(self.ordered, scale / self.min_s)
        return len(self.ordered) - at_min_from, self.prefix[at_min_from] - self.prefix[at_max], at_max

    def at(self, scale: float) -> float:
        if scale <= 0:
            return len(self.ordered) / self.min_s
        fast, between, slow = self.parts(scale)
        return fast / self.min_s + between / scale + slow / self.max_s

    def solve(self, low: float, high: float, budget_per_s: float) -> float:
        """The c in [low, high] (one segment: no lead changes bound inside it) costing the budget."""
        fast, between, slow = self.parts((low + high) / 2)
        rest = budget_per_s - fast / self.min_s - slow / self.max_s
        return high if between <= 0 or rest <= 0 else min(high, max(low, between / rest))


def plan_revisits(leads: Sequence[LeadCadence], *, now_s: float, min_s: float, max_s: float,
                  budget_per_s: float) -> RevisitPlan:
    """The leads due now under the square-root rule (module docstring), earliest due first (a
    lead's due time is its last collection plus its interval; ties by lead id). Leads already
    waiting are planned for (they spend the budget) but are not due again."""
    scores = [math.sqrt(lead.weight * lead.rate_per_s) for lead in leads]
    if min_s == max_s:  # a fixed cadence: every lead alike, whatever its history
        scale, short = math.inf, False
    else:
        scale = cadence_scale(scores, min_s=min_s, max_s=max_s, budget_per_s=budget_per_s)
        short = scale == math.inf
    intervals = [revisit_interval_s(score, scale, min_s=min_s, max_s=max_s) for score in scores]
    due = sorted((lead.last_at_s + interval, lead.lead_id) for lead, interval in zip(leads, intervals, strict=True)
                 if not lead.waiting and lead.last_at_s + interval <= now_s)
    planned = sorted(interval for interval in intervals if interval != math.inf)
    return RevisitPlan(due=[lead_id for _, lead_id in due], scale=scale,
                       spend_per_s=sum(1 / interval for interval in planned), short=short,
                       intervals_s=tuple(planned),
                       by_lead={lead.lead_id: interval for lead, interval in zip(leads, intervals, strict=True)})


# -- a source's plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonitoredLead:
    """A lead a source monitors, as the store keeps it: when it was last collected, its rate of
    change as estimated at its last visit for the source's current prior (None: not known, then
    estimated from its visits, oldest first), whether an open case holds it, and whether a
    collection of it is waiting or running."""

    lead_id: str
    last_at_s: float
    visits: tuple[Visit, ...] = ()
    rate_per_s: float | None = None
    open_case: bool = True
    waiting: bool = False


def estimate_rates(leads: Sequence[MonitoredLead], prior_rate: float) -> tuple[list[MonitoredLead], dict[str, float]]:
    """Each lead with its rate: the one kept from its last visit, else estimated from its visits
    now (a lead whose rate was kept for another prior, or not at all); and those estimated now from
    visits, for the caller to keep."""
    estimated: dict[str, float] = {}
    filled = []
    for lead in leads:
        if lead.rate_per_s is None:
            rate = change_rate(lead.visits, prior_rate)
            if lead.visits:
                estimated[lead.lead_id] = rate
            lead = replace(lead, rate_per_s=rate)
        filled.append(lead)
    return filled, estimated


def plan_source(spec: SourceSpec, leads: Sequence[MonitoredLead], *, now_s: float) -> RevisitPlan:
    """A source's recurring plan now: each lead's rate (`estimate_rates`, with the source's prior),
    its weight from its cases, planned within the source's budget and `recrawl` bounds."""
    filled, _ = estimate_rates(leads, prior_rate_per_s(spec))
    cadences = [LeadCadence(lead.lead_id, lead.last_at_s, lead.rate_per_s or 0.0,
                            lead_weight(spec, open_case=lead.open_case), lead.waiting) for lead in filled]
    budget = recurring_budget_per_s(spec, total_weight=sum(lead.weight for lead in cadences))
    return plan_revisits(cadences, now_s=now_s, min_s=spec.recrawl.min_s, max_s=spec.recrawl.max_s,
                         budget_per_s=budget)


@dataclass(frozen=True)
class SourcePlan:
    """What a source's last recurring plan decided for every lead at once: its cadence scale c
    (`cadence_scale`; inf: every lead at `max`) and whether its budget was short. With one lead's
    rate and weight it gives that lead's interval in O(1) (`planned_interval_s`), without planning
    every lead the source monitors again."""

    scale: float
    short: bool = False


def planned_interval_s(spec: SourceSpec, *, rate_per_s: float, open_case: bool, plan: SourcePlan | None) -> float:
    """One lead's interval under its source's last plan: the square-root rule (`revisit_interval_s`)
    with the plan's scale c and the lead's own rate and weight now. It may lag the next plan: c is
    the budget's split as of that plan, and moves as other leads' rates are estimated again and
    leads join or leave cases. A fixed cadence needs no plan (every lead every `min`). A learned
    one not planned yet takes the scale of a source whose leads all change at its prior, spending
    what the fixed cadence would (c = √every: a lead at the prior's rate every `every`)."""
    bounds = spec.recrawl
    if bounds.is_fixed:
        scale = math.inf
    elif plan is None:
        scale = math.sqrt(bounds.prior_s)
    else:
        scale = plan.scale
    score = math.sqrt(lead_weight(spec, open_case=open_case) * rate_per_s)
    return revisit_interval_s(score, scale, min_s=bounds.min_s, max_s=bounds.max_s)


def why(spec: SourceSpec, *, rate_per_s: float, interval_s: float, open_case: bool, short: bool = False) -> str:
    """Why a lead is looked at as often as it is, in a line an operator reads."""
    bounds = spec.recrawl
    if interval_s == math.inf:
        return "not collected again: only closed cases hold it"
    if bounds.is_fixed:
        return f"fixed cadence: every {duration(interval_s)}"
    text = f"changes about {rate_per_s * 86_400:.2g} time(s) a day, so every {duration(interval_s)}"
    if short:
        return text + f" (the source's budget is short: every lead at its max, {duration(bounds.max_s)})"
    if interval_s <= bounds.min_s:
        return text + f" (its min: it changes faster than the source looks, {duration(bounds.min_s)})"
    if interval_s >= bounds.max_s:
        return text + f" (its max, {duration(bounds.max_s)})"
    return text + ("" if open_case else " (closed cases only: weighs less)")


def duration(seconds: float) -> str:
    """A length of time as an operator reads it: `6 h`, `1.5 d`, `30 min`."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


# -- a source's settings ----------------------------------------------------------------------------


def prior_rate_per_s(spec: SourceSpec) -> float:
    """The rate a lead of the source starts from: once per its `recrawl.every`."""
    return 1.0 / spec.recrawl.prior_s


def lead_weight(spec: SourceSpec, *, open_case: bool) -> float:
    """What a lead weighs in its source's plan: OPEN_WEIGHT in an open case, else the source's
    `recrawl.closed_weight`."""
    return OPEN_WEIGHT if open_case else spec.recrawl.closed_weight


def recurring_budget_per_s(spec: SourceSpec, *, total_weight: float) -> float:
    """Collections per second a source's recurring crawls may plan for (one request each): what
    the fixed cadence `recrawl.every` would spend on its leads (their weights' sum / every, so a
    learned cadence costs what the fixed one did and only decides where it goes), within the share
    of its rate left to recurring work (`recrawl.share` × `rate.source_per_s`) and what its
    `daily_budget_usd` buys at its `cost_per_request_usd`, when it has both."""
    budget = min(total_weight / spec.recrawl.prior_s, spec.recrawl.share * spec.rate.source_per_s)
    if spec.daily_budget_usd > 0 and spec.cost_per_request_usd > 0:
        budget = min(budget, spec.daily_budget_usd / spec.cost_per_request_usd / 86_400)
    return budget
