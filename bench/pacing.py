"""Pacing against a real limiter: nginx `limit_req` in front of a sandbox source, three fleets side by side.

Each fleet gets its own nginx zone (same rate and burst) in front of the sandbox's `robust` route and
runs at the same time as the others, with several worker processes as separate runs of one source
would:
- paced: the fleet as designed, every request waiting for its shared GCRA lanes (one SQLite store
  file shared by the fleet's processes), configured to the limiter's permitted rate;
- fixed_delay: no lanes, each worker sleeping a fixed delay x U(0.5, 1.5) so the fleet's nominal rate
  equals the permitted rate;
- naive: no lanes, as many requests in flight as it has threads.
The limiter's own log counts what it admitted and refused; the clients' send times give each lane's
gap CV and periodogram peak (a mechanical rhythm is a fingerprint).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    Run,
    ToolMissing,
    WorkerPlan,
    dump_spec,
    engine_digest,
    finish,
    host_load,
    lane_figures,
    ok_count,
    parse_args,
    print_table,
    report_host,
    run_workers,
    status_counts,
    timeline,
)
from bench.nginx import Limiter, Nginx

NAME = "pacing"
DEFAULT_DURATION_S = 300.0
RATE_PER_S = 5  # nginx rate=5r/s ...
BURST = 5  # ... burst=5 nodelay; the fleet's source lane is configured to the same
WORKERS = 4  # processes per fleet
NAIVE_THREADS = 8  # requests in flight per naive worker
FLEETS = ("paced", "fixed_delay", "naive")
GOAL_RATIO = 0.95
GOAL_REJECTIONS = 0

PERMITTED = (
    "nginx limit_req is a leaky bucket: each admitted request adds 1 to it, it drains at the rate r, and "
    "a request that would lift it above `burst` is refused (here with 429). With `nodelay` up to burst+1 "
    "requests pass back to back, then one per 1/r s. So any window of T s admits at most r*T + burst + 1 "
    "requests: the permitted sustained rate is r, and the burst is a one-off allowance, not extra rate. "
    "Refused requests do not fill the bucket, so hammering does not lower what gets through, it only "
    "adds refusals."
)

_SPEC = """
sources:
  - name: limited
    description: the sandbox's robust route behind nginx limit_req
    adapter: json_api
    lead_kinds: [username]
    request: {url: "URL/robust/api/lookup?kind={kind}&q={value}"}
    parse: {records_path: results}
    rate: {source_per_s: RATE, source_burst: LANE_BURST, identity_per_s: RATE, identity_burst: LANE_BURST}
    concurrency: WORKERS
    timeout_s: 5
    retry: {attempts: 4, base_delay_s: 0.5, max_delay_s: 10}
"""


def fleet_spec(url: str, lane_burst: int = BURST) -> dict[str, Any]:
    """The fleet's source pointed at one limiter, rate and burst as nginx's (built like sources.yaml)."""
    from investigations.sources.specs import parse_sources

    text = (_SPEC.replace("URL", url).replace("RATE", str(RATE_PER_S)).replace("LANE_BURST", str(lane_burst))
            .replace("WORKERS", str(WORKERS)))
    return dump_spec(parse_sources(text, origin="bench/pacing").sources[0])


def plans_for(fleet: str, spec: dict[str, Any], store_url: str, workers: int) -> list[WorkerPlan]:
    """Worker processes of one fleet; each worker is its own identity (its own identity lane)."""
    common: dict[str, Any] = {"group": fleet, "spec": spec, "store_url": store_url}
    if fleet == "paced":
        extra: dict[str, Any] = {"paced": True}
    elif fleet == "fixed_delay":
        # Each worker's mean delay is workers / rate, so the fleet's nominal rate is the permitted one.
        extra = {"paced": False, "fixed_delay_s": workers / RATE_PER_S}
    else:
        extra = {"paced": False, "threads": NAIVE_THREADS}
    return [WorkerPlan(identity_id=f"{fleet.replace('_', '-')}-{i}", seed=101 * (i + 1), **common, **extra)
            for i in range(workers)]


def fleet_figures(fleet: str, run: Run, limiter_log: list[tuple[float, int]], workers: int) -> dict[str, Any]:
    """One fleet's figures: what the limiter admitted and refused, what the clients saw, per-lane timing."""
    in_window = [status for at, status in limiter_log if run.start_s <= at < run.deadline_s]
    admitted = sum(1 for status in in_window if 200 <= status < 300)
    rows = run.rows(fleet)
    limiter_rows = [(at, status, 0.0) for at, status in limiter_log]
    bin_s = max(5.0, run.duration_s / 10)
    lanes = {"source": lane_figures(rows, run.start_s, run.deadline_s)}
    for identity in run.identities(fleet):
        lanes[f"identity:{identity}"] = lane_figures(run.rows(fleet, identity), run.start_s, run.deadline_s)
    return {
        "workers": workers,
        "threads_per_worker": NAIVE_THREADS if fleet == "naive" else 1,
        "sent": len(rows),
        "admitted": admitted,
        "sustained_rate_per_s": admitted / run.duration_s,
        "sustained_over_permitted": admitted / run.duration_s / RATE_PER_S,
        "limiter_rejections": sum(1 for _, status in limiter_log if status == 429),
        "limiter_status_counts": status_counts(limiter_rows),
        "limiter_timeline": timeline(limiter_rows, run.start_s, run.deadline_s, bin_s),
        "client_status_counts": status_counts(rows),
        "client_ok": ok_count(rows),
        "fetch_outcomes": run.outcomes(fleet),
        "lanes": lanes,
    }


def run(duration_s: float = DEFAULT_DURATION_S, *, workers: int = WORKERS,
        lane_burst: int = BURST) -> dict[str, Any]:
    """Run the three fleets side by side for `duration_s`, each behind its own nginx zone; return the figures.

    `lane_burst` is the fleet's source and identity burst (default: nginx's), to explore other settings.
    """
    from investigations.sandbox import SandboxConfig, start_in_thread

    # The engine is read at the start: spawned workers load the sources as they are then.
    load_before, engine = host_load(), engine_digest()
    limiters = [Limiter(fleet, RATE_PER_S, BURST) for fleet in FLEETS]
    with (tempfile.TemporaryDirectory(prefix="bench-pacing-") as tmp,
          start_in_thread(SandboxConfig()) as sandbox,
          Nginx(limiters, f"127.0.0.1:{sandbox.port}") as nginx):
        plans = [plan for fleet in FLEETS for plan in plans_for(
            fleet, fleet_spec(nginx.url(fleet), lane_burst), f"sqlite:///{Path(tmp) / fleet}.db", workers)]
        result = run_workers(plans, duration_s=duration_s)
        fleets = {fleet: fleet_figures(fleet, result, nginx.log_rows(fleet), workers) for fleet in FLEETS}
    paced = fleets["paced"]
    return {
        "bench": NAME,
        "started_at": datetime.fromtimestamp(result.start_s, UTC).isoformat(),
        "duration_s": duration_s,
        "engine": engine,
        "host": {"before": load_before, "after": host_load()},
        "limiter": {
            "nginx": f"limit_req rate={RATE_PER_S}r/s burst={BURST} nodelay; limit_req_status 429",
            "permitted_rate_per_s": RATE_PER_S,
            "burst": BURST,
            "max_admitted_in_window": RATE_PER_S * duration_s + BURST + 1,
            "permitted_means": PERMITTED,
        },
        "fleet_config": {"source_per_s": RATE_PER_S, "source_burst": lane_burst, "identity_per_s": RATE_PER_S,
                         "identity_burst": lane_burst, "fixed_delay_s": workers / RATE_PER_S,
                         "workers": workers},
        "goals": {"sustained_over_permitted_min": GOAL_RATIO, "limiter_rejections_max": GOAL_REJECTIONS},
        "paced_meets_goals": paced["sustained_over_permitted"] >= GOAL_RATIO
        and paced["limiter_rejections"] <= GOAL_REJECTIONS,
        "fleets": fleets,
        "errors": result.errors(),
    }


def report(figures: dict[str, Any]) -> None:
    """Print the fleets side by side, then the per-lane timing."""
    fleets = figures["fleets"]
    config = figures["fleet_config"]
    print(f"\nPacing vs nginx {figures['limiter']['nginx']}, {figures['duration_s']:g} s per fleet, "
          f"fleets side by side ({config['workers']} worker processes each); paced fleet configured at "
          f"{config['source_per_s']} r/s, burst {config['source_burst']}; engine {figures['engine']}")
    print(f"  permitted: {figures['limiter']['permitted_means']}")
    print_table(
        "Throughput against the limiter (goal for paced: sustained/permitted >= 0.95, limiter 429s = 0)",
        ["fleet", "sent", "admitted", "sustained r/s", "sustained/permitted", "limiter 429s", "no answer"],
        [[name, f["sent"], f["admitted"], f["sustained_rate_per_s"], f["sustained_over_permitted"],
          f["limiter_rejections"], f["client_status_counts"].get("0", 0)] for name, f in fleets.items()],
    )
    rows = []
    for name, f in fleets.items():
        for lane, t in f["lanes"].items():
            rows.append([f"{name} {lane}", t["requests"], t["rate_per_s"], t["gap_cv"], t["peak_ratio"],
                         t["noise_peak_ratio"], t["peak_period_s"]])
    print_table(
        "Arrival timing per lane (gap CV: 0 = metronome, 1 = Poisson; peak = strongest periodogram power"
        " / mean; 'no-period' = the same ratio expected from noise alone)",
        ["lane", "sent", "r/s", "gap CV", "peak", "no-period", "period s"],
        rows,
    )
    bins = zip(*(f["limiter_timeline"] for f in fleets.values()), strict=True)
    print_table("Timeline at the limiter: admitted/s and 429s per bin",
                ["from s", *(f"{name} {what}" for name in fleets for what in ("ok/s", "429s"))],
                [[row[0]["from_s"], *(v for b in row for v in (b["ok_per_s"], b["throttled"]))]
                 for row in bins])
    print(f"\n  paced fleet meets the goals: {figures['paced_meets_goals']}")
    report_host(figures)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.pacing [--duration-s S] [--workers N] [--results-dir DIR]`."""
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workers", type=int, default=WORKERS,
                            help=f"worker processes per fleet (default {WORKERS})")
        parser.add_argument("--lane-burst", type=int, default=BURST,
                            help=f"the paced fleet's source and identity burst (default {BURST}, nginx's)")

    args = parse_args(argv, description=__doc__.splitlines()[0], default_duration_s=DEFAULT_DURATION_S,
                      extra=options)
    try:
        figures = run(args.duration_s, workers=args.workers, lane_burst=args.lane_burst)
    except ToolMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    report(figures)
    return finish(NAME, figures, args.results_dir)


if __name__ == "__main__":
    sys.exit(main())
