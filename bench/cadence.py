"""Learned cadence against a fixed one: a simulated month of recurring crawls of the sandbox's `changing` leads.

The leads are the sandbox's `changing` source (`investigations.sandbox.changing.ChangeModel`): each
lead's answer changes as a Poisson process at a rate fixed by the lead, a fifth never, the others
log-uniformly from hourly to yearly. The clock is simulated: the planner is asked every `--tick-s`
(the fleet's sensor asks every minute), and a due lead is collected at that moment.

The decisions are the engine's, the functions the fleet runs: a visit is kept by `cadence.observe`
and its lead's rate estimated by `cadence.change_rate` as the store does in a collection's
transaction, and each planning pass is `cadence.plan_source`, as the `recurring_crawls` sensor's
(weights, budget and bounds from the source's spec, built from YAML as in `sources.yaml`). What the bench adds is the world: the change model, the
clock, and no Dagster, store or network in between (a collection is instant and always answers;
the content hash is the answer's version, which the content is a function of).

Policies, over the same leads and the same change times:
- fixed: `recrawl_every: 6h` (every lead every 6 h, what the fleet did before);
- learned at equal requests: `recrawl: {min: 1h, max: 30d, every: 6h}` (its budget: what the fixed
  cadence spends);
- learned at equal freshness: the same, its budget cut (`recrawl.share` of the source's rate) to the
  smallest share of the fixed cadence's requests whose freshness is still at least the fixed one's,
  found by bisection.

Figures, over the measured month (from when every lead has been collected once): (a) the mean
delay between a change and the collection that finds it (each change, and each detection: from the
first change the stored answer missed), (b) the time-averaged share of leads whose stored answer is
the live one, (c) the requests each policy spent (one per collection), and the requests spent on
leads that never changed. Goals: at equal requests, mean delay <= 0.5 x the fixed cadence's; at
equal freshness, <= 0.6 x its requests.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, engine_digest, finish, host_load, print_table, report_host
from investigations.sandbox.changing import ChangeModel
from investigations.scheduling.cadence import (
    ChangeHistory,
    MonitoredLead,
    change_rate,
    observe,
    plan_source,
    prior_rate_per_s,
)
from investigations.sources.specs import SourceSpec, parse_sources

NAME = "cadence"
DAY_S = 86_400.0
FIXED_EVERY_S = 6 * 3_600.0
T0 = datetime(2026, 1, 5, tzinfo=UTC).timestamp()
GOAL_DELAY_RATIO = 0.5  # at equal requests
GOAL_REQUEST_RATIO = 0.6  # at equal freshness
SEARCH_STEPS = 6  # bisection steps for the equal-freshness budget (1/64 of the range)
SEARCH_RANGE = (0.2, 1.0)  # shares of the fixed cadence's requests searched

# Built as sources.yaml entries are; RATE and SHARE are filled in per run. The rate is high enough that
# the budget is `every`'s unless SHARE cuts it.
_SPEC = """
sources:
  - name: changing
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "http://127.0.0.1:8800/changing/api/lookup?kind={kind}&q={value}"}
    parse: {records_path: results, record_key: id}
    rate: {source_per_s: RATE}
    RECRAWL
"""
FIXED = "recrawl_every: 6h"
LEARNED = "recrawl: {min: 1h, max: 30d, every: 6h, share: SHARE}"


def spec_for(recrawl: str, *, leads: int, budget_share: float = 1.0) -> SourceSpec:
    """The `changing` source with this recrawl setting; `budget_share`: its recurring budget as a share
    of the fixed cadence's requests (through `recrawl.share` of a rate twice the fixed cadence's)."""
    rate = 2 * leads / FIXED_EVERY_S
    text = _SPEC.replace("RECRAWL", recrawl.replace("SHARE", repr(budget_share / 2))).replace("RATE", repr(rate))
    return parse_sources(text, env={}).get("changing")


@dataclass
class _Lead:
    q: str
    rate_per_s: float
    first_at_s: float
    last_at_s: float = 0.0
    history: ChangeHistory | None = None
    planned: MonitoredLead = field(default_factory=lambda: MonitoredLead("", 0.0))


@dataclass
class _Tally:
    requests: int = 0
    requests_on_never_changing: int = 0
    delays_s: list[float] = field(default_factory=list)  # per change found
    detection_ages_s: list[float] = field(default_factory=list)  # per collection that found a change
    stale_s: float = 0.0


def simulate(spec: SourceSpec, model: ChangeModel, qs: Sequence[str], *, days: float, tick_s: float) -> dict[str, Any]:
    """One policy over the month: every lead collected once in the first FIXED_EVERY_S (spread
    evenly), then the measured `days`, the planner asked every `tick_s`."""
    leads = [_Lead(q, model.rate_per_s("domain", q), T0 + n / len(qs) * FIXED_EVERY_S) for n, q in enumerate(qs)]
    start_s = T0 + FIXED_EVERY_S
    end_s = start_s + days * DAY_S
    tally = _Tally()
    prior = prior_rate_per_s(spec)
    by_id = {lead.q: lead for lead in leads}
    planned: list[MonitoredLead] = []
    position: dict[str, int] = {}
    waiting = sorted(leads, key=lambda lead: lead.first_at_s)
    now_s, intervals = T0, []
    while now_s <= end_s:
        while waiting and waiting[0].first_at_s <= now_s:
            lead = waiting.pop(0)
            _collect(lead, model, now_s, prior_rate=prior, start_s=start_s, tally=None)
            position[lead.q] = len(planned)
            planned.append(lead.planned)
        plan = plan_source(spec, planned, now_s=now_s)
        for q in plan.due:
            lead = by_id[q]
            _collect(lead, model, now_s, prior_rate=prior, start_s=start_s, tally=tally if now_s > start_s else None)
            planned[position[q]] = lead.planned
        if now_s > start_s and plan.intervals_s:
            intervals.append(plan.median_interval_s)
        now_s += tick_s
    for lead in leads:  # the answers still stale at the end
        missed = model.changes("domain", lead.q, lead.last_at_s, end_s)
        if missed:
            tally.stale_s += end_s - max(missed[0], start_s)
    return _figures(tally, leads=len(qs), days=days, intervals=intervals)


def _collect(lead: _Lead, model: ChangeModel, now_s: float, *, prior_rate: float, start_s: float,
             tally: _Tally | None) -> None:
    """Collect `lead` at `now_s`: what it finds and when the stored answer went stale (`tally`: in the
    measured window), its history and rate (`cadence.observe` and `cadence.change_rate`, as the store
    keeps them with the visit) and its planner row."""
    if tally is not None:
        tally.requests += 1
        tally.requests_on_never_changing += lead.rate_per_s == 0
        missed = model.changes("domain", lead.q, lead.last_at_s, now_s)
        if missed:
            tally.delays_s.extend(now_s - change for change in missed if change > start_s)
            tally.detection_ages_s.append(now_s - missed[0])
            tally.stale_s += now_s - max(missed[0], start_s)
    version = model.version("domain", lead.q, now_s)
    lead.history = observe(lead.history, at_s=now_s, content_hash=repr(version))
    lead.last_at_s = now_s
    lead.planned = MonitoredLead(lead.q, now_s, rate_per_s=change_rate(lead.history.visits, prior_rate))


def _figures(tally: _Tally, *, leads: int, days: float, intervals: list[float | None]) -> dict[str, Any]:
    def mean_h(values: list[float]) -> float | None:
        return round(sum(values) / len(values) / 3_600, 4) if values else None

    medians = sorted(value for value in intervals if value is not None)
    return {
        "requests": tally.requests,
        "requests_on_never_changing": tally.requests_on_never_changing,
        "mean_delay_h": mean_h(tally.delays_s),
        "mean_detection_age_h": mean_h(tally.detection_ages_s),
        "freshness": round(1 - tally.stale_s / (leads * days * DAY_S), 5),
        "changes_found": len(tally.delays_s),
        "detections": len(tally.detection_ages_s),
        "median_planned_interval_h": round(medians[len(medians) // 2] / 3_600, 3) if medians else None,
    }


def equal_freshness(model: ChangeModel, qs: Sequence[str], *, days: float, tick_s: float,
                    target: float) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """The smallest budget share (of the fixed cadence's requests) at which the learned cadence is at
    least as fresh as `target`, by bisection over SEARCH_RANGE; its figures, and every step's."""
    low, high = SEARCH_RANGE
    best: tuple[float, dict[str, Any]] | None = None
    steps = []
    for _ in range(SEARCH_STEPS):
        share = round((low + high) / 2, 6)
        figures = simulate(spec_for(LEARNED, leads=len(qs), budget_share=share), model, qs, days=days, tick_s=tick_s)
        steps.append({"budget_share": share, **figures})
        if figures["freshness"] >= target:
            high, best = share, (share, figures)
        else:
            low = share
    if best is None:  # never reached: the top of the range
        share = high
        figures = simulate(spec_for(LEARNED, leads=len(qs), budget_share=share), model, qs, days=days, tick_s=tick_s)
        best = (share, figures)
    return best[0], best[1], steps


def run(*, leads: int, days: float, tick_s: float, seed: int) -> dict[str, Any]:
    started, load_before, wall = datetime.now(UTC), host_load(), time.monotonic()
    model = ChangeModel(seed)
    qs = [f"lead{n:05d}.example" for n in range(leads)]
    fixed = simulate(spec_for(FIXED, leads=leads), model, qs, days=days, tick_s=tick_s)
    same_requests = simulate(spec_for(LEARNED, leads=leads), model, qs, days=days, tick_s=tick_s)
    share, same_freshness, steps = equal_freshness(model, qs, days=days, tick_s=tick_s, target=fixed["freshness"])
    policies = {"fixed": fixed, "learned_equal_requests": same_requests,
                "learned_equal_freshness": {"budget_share": share, **same_freshness}}
    for figures in policies.values():
        figures["request_ratio"] = round(figures["requests"] / fixed["requests"], 4)
        figures["delay_ratio"] = round(figures["mean_delay_h"] / fixed["mean_delay_h"], 4)
    delay_ratio = policies["learned_equal_requests"]["delay_ratio"]
    request_ratio = policies["learned_equal_freshness"]["request_ratio"]
    return {
        "bench": NAME,
        "started_at": started.isoformat(),
        "engine": engine_digest(),
        "config": {"leads": leads, "simulated_days": days, "tick_s": tick_s, "seed": seed,
                   "fixed": FIXED, "learned": LEARNED.replace("SHARE", "0.5"),
                   "never_changing_leads": sum(model.rate_per_s("domain", q) == 0 for q in qs)},
        "policies": policies,
        "search": steps,
        "goals": {"delay_ratio_at_equal_requests": GOAL_DELAY_RATIO,
                  "request_ratio_at_equal_freshness": GOAL_REQUEST_RATIO},
        "delay_ratio_at_equal_requests": delay_ratio,
        "request_ratio_at_equal_freshness": request_ratio,
        "meets_goals": {"delay": delay_ratio <= GOAL_DELAY_RATIO, "requests": request_ratio <= GOAL_REQUEST_RATIO},
        "wall_s": round(time.monotonic() - wall, 1),
        "host": {"before": load_before, "after": host_load()},
        "errors": [],
    }


def report(figures: dict[str, Any]) -> None:
    config, policies = figures["config"], figures["policies"]
    print(f"\nCadence over {config['simulated_days']:g} simulated days, {config['leads']} leads of the sandbox's "
          f"`changing` source ({config['never_changing_leads']} never change), planner every "
          f"{config['tick_s']:g} s; engine {figures['engine']}")
    labels = {"fixed": "fixed 6h", "learned_equal_requests": "learned, equal requests",
              "learned_equal_freshness": f"learned, equal freshness "
                                         f"({policies['learned_equal_freshness']['budget_share']:.3f} budget)"}
    rows = [[labels[name], p["requests"], p["request_ratio"], p["mean_delay_h"], p["delay_ratio"],
             p["mean_detection_age_h"], p["freshness"], p["requests_on_never_changing"],
             p["median_planned_interval_h"]] for name, p in policies.items()]
    print_table("Policies side by side", ["policy", "requests", "x fixed", "mean delay h", "x fixed",
                                          "detection age h", "freshness", "on never-changing", "median interval h"],
                rows)
    met = figures["meets_goals"]
    print(f"\n  at equal requests: mean delay {figures['delay_ratio_at_equal_requests']:.3f} x fixed "
          f"(goal <= {GOAL_DELAY_RATIO}): {'met' if met['delay'] else 'NOT met'}")
    print(f"  at equal freshness: requests {figures['request_ratio_at_equal_freshness']:.3f} x fixed "
          f"(goal <= {GOAL_REQUEST_RATIO}): {'met' if met['requests'] else 'NOT met'}")
    print(f"  wall time {figures['wall_s']:g} s")
    report_host(figures)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """`[--leads N] [--days D] [--tick-s S] [--seed N] [--results-dir DIR]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leads", type=int, default=300, help="leads (default 300)")
    parser.add_argument("--days", type=float, default=30.0, help="simulated days measured (default 30)")
    parser.add_argument("--tick-s", type=float, default=300.0, help="simulated seconds between plans (default 300)")
    parser.add_argument("--seed", type=int, default=7, help="the change model's seed (default 7)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help=f"where the JSON goes (default {RESULTS_DIR})")
    args = parser.parse_args(argv)
    if args.leads < 1 or args.days <= 0 or args.tick_s <= 0:
        parser.error("--leads, --days and --tick-s must be above 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.cadence [--leads N] [--days D] [--tick-s S] [--seed N] [--results-dir DIR]`."""
    args = parse_args(argv)
    figures = run(leads=args.leads, days=args.days, tick_s=args.tick_s, seed=args.seed)
    report(figures)
    return finish(NAME, figures, args.results_dir)


if __name__ == "__main__":
    raise SystemExit(main())

