"""Convergence: the source lowers its limit mid-run; how fast does the fleet stop hitting 429s?

A paced fleet (several worker processes, one shared SQLite store) sends to the sandbox's fragile
route, configured below the route's starting limit. A quarter of the way in, the sandbox lowers the
limit under the fleet's configured rate, so the configuration alone would keep the fleet above it:
only AIMD (the lane's rate factor cut on each 429) and Retry-After (a floor on the lane) can bring it
down. Reported: the time from the change until the last 429 that is followed by a quiet window
(no 429 for `--quiet-window-s` to the end of the run), and the rate achieved after it vs the new limit.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    WorkerPlan,
    dump_spec,
    engine_digest,
    finish,
    host_load,
    ok_count,
    parse_args,
    print_table,
    report_host,
    run_workers,
    status_counts,
    timeline,
)

NAME = "convergence"
DEFAULT_DURATION_S = 120.0
CHANGE_AT_SHARE = 0.25  # the limit drops this far into the run
INITIAL_LIMIT_PER_S, INITIAL_BURST = 4.0, 4  # the sandbox's limit before the change ...
NEW_LIMIT_PER_S, NEW_BURST = 1.0, 2  # ... and after it
FLEET_RATE_PER_S, FLEET_BURST = 3.0, 2  # the fleet's configured rate: below the first limit, 3x the new one
WORKERS = 4
DEFAULT_QUIET_WINDOW_S = 10.0
TIMELINE_BIN_S = 10.0

_SPEC = """
sources:
  - name: fragile
    adapter: json_api
    lead_kinds: [username]
    request: {url: "URL/fragile/api/search?kind={kind}&q={value}"}
    parse: {records_path: results}
    rate: {source_per_s: RATE, source_burst: BURST, identity_per_s: RATE, identity_burst: BURST}
    timeout_s: 5
    retry: {attempts: 6, base_delay_s: 1, max_delay_s: 20}
"""


def fleet_spec(url: str) -> dict[str, Any]:
    """The fleet's source (as in sources.yaml's fragile entry), configured at FLEET_RATE_PER_S."""
    from investigations.sources.specs import parse_sources

    text = _SPEC.replace("URL", url).replace("RATE", str(FLEET_RATE_PER_S)).replace("BURST", str(FLEET_BURST))
    return dump_spec(parse_sources(text, origin="bench/convergence").sources[0])


def convergence(throttled_at: Sequence[float], change_s: float, end_s: float,
                quiet_window_s: float) -> dict[str, Any]:
    """When the fleet stopped hitting 429s after `change_s`.

    `converged_after_s` is the time from the change to the last 429, provided no 429 follows it for at
    least `quiet_window_s` before the end (0 if none came at all); None when the run ends without such
    a window. `first_quiet_after_s` is when the first 429-free window of that length began.
    """
    after = sorted(t for t in throttled_at if t >= change_s)
    if not after:
        return {"converged_after_s": 0.0, "first_quiet_after_s": 0.0, "first_429_after_s": None,
                "last_429_after_s": None}
    last = after[-1]
    quiet_ends = [*after[1:], end_s]
    quiet = (t for t, nxt in zip(after, quiet_ends, strict=True) if nxt - t >= quiet_window_s)
    first_quiet = next(quiet, None)
    return {
        "converged_after_s": last - change_s if end_s - last >= quiet_window_s else None,
        "first_quiet_after_s": None if first_quiet is None else first_quiet - change_s,
        "first_429_after_s": after[0] - change_s,
        "last_429_after_s": last - change_s,
    }


def run(duration_s: float = DEFAULT_DURATION_S, *,
        quiet_window_s: float = DEFAULT_QUIET_WINDOW_S) -> dict[str, Any]:
    """Run the fleet, lower the limit at a quarter of the run, and measure how the fleet settles."""
    from investigations.pacing import GapSampler, RateLanes
    from investigations.sandbox import SandboxConfig, start_in_thread
    from investigations.store import StateStore

    # The engine is read at the start: spawned workers load the sources as they are then.
    load_before, engine = host_load(), engine_digest()
    change_at_s = duration_s * CHANGE_AT_SHARE
    config = SandboxConfig(fragile_rate_per_s=INITIAL_LIMIT_PER_S, fragile_burst=INITIAL_BURST)
    with tempfile.TemporaryDirectory(prefix="bench-convergence-") as tmp, start_in_thread(config) as sandbox:
        store_url = f"sqlite:///{Path(tmp) / 'fleet.db'}"
        spec = fleet_spec(sandbox.url)
        plans = [WorkerPlan(group="fleet", identity_id=f"fleet-{i}", spec=spec, store_url=store_url,
                            paced=True, seed=31 * (i + 1)) for i in range(WORKERS)]

        def lower_the_limit(start_s: float) -> None:
            time.sleep(max(0.0, start_s + change_at_s - time.time()))
            sandbox.app_state.configure("fragile", {"rate_per_s": NEW_LIMIT_PER_S, "burst": NEW_BURST})

        result = run_workers(plans, duration_s=duration_s, during=lower_the_limit)
        store = StateStore.from_url(store_url)
        states = RateLanes(store, sampler=GapSampler(random.Random(0))).all_states()
        lanes = {state.lane: state.rate_factor for state in states}
        store.close()
        sandbox_counts = sandbox.app_state.snapshot()["sources"]["fragile"]
    change_s, end_s = result.start_s + change_at_s, result.deadline_s
    rows = result.rows("fleet")
    before = [r for r in rows if r[0] < change_s]
    after = [r for r in rows if r[0] >= change_s]
    settled = convergence([r[0] for r in rows if r[1] == 429], change_s, end_s, quiet_window_s)
    # The achieved rate is read after convergence; without it, over the second half after the change.
    tail_from_s = (change_s + settled["converged_after_s"] if settled["converged_after_s"] is not None
                   else change_s + (end_s - change_s) / 2)
    tail = [r for r in after if r[0] >= tail_from_s]
    tail_rate = ok_count(tail) / (end_s - tail_from_s) if end_s > tail_from_s else None
    return {
        "bench": NAME,
        "started_at": datetime.fromtimestamp(result.start_s, UTC).isoformat(),
        "duration_s": duration_s,
        "engine": engine,
        "host": {"before": load_before, "after": host_load()},
        "change_at_s": change_at_s,
        "quiet_window_s": quiet_window_s,
        "limits": {"before_per_s": INITIAL_LIMIT_PER_S, "before_burst": INITIAL_BURST,
                   "after_per_s": NEW_LIMIT_PER_S, "after_burst": NEW_BURST},
        "fleet_config": {"source_per_s": FLEET_RATE_PER_S, "source_burst": FLEET_BURST, "workers": WORKERS},
        "before_change": {"ok_per_s": ok_count(before) / change_at_s, "status_counts": status_counts(before)},
        "after_change": {"status_counts": status_counts(after),
                         "throttled": sum(1 for r in after if r[1] == 429), **settled},
        "achieved": {"from_s_after_change": tail_from_s - change_s, "ok_per_s": tail_rate,
                     "over_new_limit": None if tail_rate is None else tail_rate / NEW_LIMIT_PER_S},
        "rate_factors_at_end": lanes,
        "timeline": timeline(rows, result.start_s, end_s, TIMELINE_BIN_S),
        "sandbox": sandbox_counts,
        "fetch_outcomes": result.outcomes("fleet"),
        "errors": result.errors(),
    }


def report(figures: dict[str, Any]) -> None:
    """Print the convergence figures and the timeline."""
    after, achieved, limits = figures["after_change"], figures["achieved"], figures["limits"]
    print(f"\nConvergence: fleet configured at {figures['fleet_config']['source_per_s']:g} r/s "
          f"({figures['fleet_config']['workers']} worker processes); the source's limit drops from "
          f"{limits['before_per_s']:g} to {limits['after_per_s']:g} r/s at {figures['change_at_s']:g} s of "
          f"{figures['duration_s']:g} s; engine {figures['engine']}")
    print_table(
        f"After the change (converged = the last 429 followed by >= {figures['quiet_window_s']:g} s "
        "without one)",
        ["figure", "value"],
        [["429s before the change", figures["before_change"]["status_counts"].get("429", 0)],
         ["ok/s before the change", figures["before_change"]["ok_per_s"]],
         ["429s after the change", after["throttled"]],
         ["first 429 after change, s", after["first_429_after_s"]],
         ["first quiet window began after, s", after["first_quiet_after_s"]],
         ["converged after, s (last 429)", after["converged_after_s"]],
         [f"achieved ok/s (from {achieved['from_s_after_change']:.1f} s after change)", achieved["ok_per_s"]],
         ["achieved / new limit", achieved["over_new_limit"]],
         ["source lane rate factor at end", figures["rate_factors_at_end"].get("source:fragile")]],
    )
    print_table("Timeline", ["from s", "ok/s", "429s"],
                [[b["from_s"], b["ok_per_s"], b["throttled"]] for b in figures["timeline"]])
    report_host(figures)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.convergence [--duration-s S] [--quiet-window-s S] [--results-dir DIR]`."""
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quiet-window-s", type=float, default=DEFAULT_QUIET_WINDOW_S,
                            help=f"429-free seconds that count as settled ({DEFAULT_QUIET_WINDOW_S:g})")

    args = parse_args(argv, description=__doc__.splitlines()[0], default_duration_s=DEFAULT_DURATION_S,
                      extra=options)
    figures = run(args.duration_s, quiet_window_s=args.quiet_window_s)
    report(figures)
    return finish(NAME, figures, args.results_dir)


if __name__ == "__main__":
    sys.exit(main())
