"""Isolation: does one failing source slow the healthy ones down?

Three healthy sandbox sources (robust, slow, quiet with records) run with their own worker processes
and lanes, once alone (the baseline) and once beside a failing source on the sandbox's flaky route:
for the first half every request to it stalls past its timeout (stall_rate 1.0), then the sandbox
switches the route to a tiny rate limit (0.2 r/s, 429 + Retry-After). The switch is made in the
sandbox, not in the fleet's spec, so it reaches the retries already in flight, as it would on the web.
All sources of a run share one SQLite state store, as one fleet does. The figure is each healthy
source's completed fetches per second with the failing source as a ratio of the baseline, both
measured in this run with the same seeds.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    Run,
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
)

NAME = "isolation"
DEFAULT_DURATION_S = 90.0  # per run; the bench makes two (baseline, with the failing source)
HEALTHY = ("robust", "slow", "quiet")
FAILING = "failing"
WORKERS = 2  # processes per source
THREADS = 2  # threads per worker: a slow answer must not leave the lane idle
STALL_S = 5.0  # the failing source's stall, well past its 1 s timeout
FAILING_RATE_PER_S = 0.2  # then its rate limit: a 429 for nearly every request
STALLING = {"error_rate": 0.0, "stall_rate": 1.0, "stall_s": STALL_S, "rate_per_s": None, "burst": 1}
THROTTLING = {"error_rate": 0.0, "stall_rate": 0.0, "rate_per_s": FAILING_RATE_PER_S, "burst": 1}
GOAL_RATIO = 0.95

_SPECS = """
defaults:
  lead_kinds: [username]
  timeout_s: 5
  retry: {attempts: 4, base_delay_s: 0.5, max_delay_s: 10}
sources:
  - name: robust
    adapter: json_api
    request: {url: "URL/robust/api/lookup?kind={kind}&q={value}"}
    parse: {records_path: results}
    rate: {source_per_s: 5, source_burst: 5, identity_per_s: 5, identity_burst: 5}
  - name: slow
    adapter: html
    request: {url: "URL/slow/profile/{kind}/{value}"}
    parse: {records_selector: li.post, fields: {title: a.title}}
    rate: {source_per_s: 1.5, source_burst: 2, identity_per_s: 1.5, identity_burst: 2}
  - name: quiet
    adapter: json_api
    request: {url: "URL/quiet/api/lookup?kind={kind}&q={value}"}
    parse: {records_path: results}
    rate: {source_per_s: 3, source_burst: 3, identity_per_s: 3, identity_burst: 3}
  - name: failing
    description: the flaky route, stalling and then throttling (the sandbox switches it)
    adapter: html
    request: {url: "URL/flaky/profile/{kind}/{value}"}
    parse: {records_selector: li.post, fields: {title: a.title}}
    timeout_s: 1
    rate: {source_per_s: 4, source_burst: 4, identity_per_s: 2, identity_burst: 2}
    retry: {attempts: 3, base_delay_s: 0.5, max_delay_s: 5}
"""

def specs(url: str) -> dict[str, dict[str, Any]]:
    """The bench's sources by name, built like sources.yaml entries and pointed at the sandbox."""
    from investigations.sources.specs import parse_sources

    catalog = parse_sources(_SPECS.replace("URL", url), origin="bench/isolation")
    return {spec.name: dump_spec(spec) for spec in catalog.sources}


def plans_for(sources: Sequence[str], url: str, store_url: str) -> list[WorkerPlan]:
    """Worker processes per source, paced through the run's shared store; seeds fixed per (source, worker)."""
    by_name = specs(url)
    return [WorkerPlan(group=source, identity_id=f"{source}-{i}", spec=by_name[source], store_url=store_url,
                       paced=True, threads=THREADS, seed=1000 * (n + 1) + i)
            for n, source in enumerate(sources) for i in range(WORKERS)]


def run_figures(run: Run, sources: Sequence[str], sandbox_snapshot: dict[str, Any]) -> dict[str, Any]:
    """Per source: completed fetches/s, statuses seen, fetch outcomes; plus the sandbox's own counts."""
    figures: dict[str, Any] = {}
    for source in sources:
        rows = run.rows(source)
        ok = ok_count(rows)
        figures[source] = {"sent": len(rows), "ok": ok, "ok_per_s": ok / run.duration_s,
                           "status_counts": status_counts(rows), "fetch_outcomes": run.outcomes(source)}
        if source == FAILING:
            half = run.start_s + run.duration_s / 2
            figures[source]["status_counts_by_phase"] = {
                "stalling": status_counts(r for r in rows if r[0] < half),
                "throttling": status_counts(r for r in rows if r[0] >= half),
            }
    figures["sandbox"] = sandbox_snapshot["sources"]
    return figures


def run(duration_s: float = DEFAULT_DURATION_S) -> dict[str, Any]:
    """The baseline run and the run with the failing source, one after the other; return the figures."""
    from investigations.sandbox import SandboxConfig, start_in_thread

    # The engine is read at the start: spawned workers load the sources as they are then.
    load_before, engine = host_load(), engine_digest()
    runs: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    config = SandboxConfig(quiet_empty=False)
    with tempfile.TemporaryDirectory(prefix="bench-isolation-") as tmp, start_in_thread(config) as sandbox:

        def throttle_at_half_time(start_s: float) -> None:
            time.sleep(max(0.0, start_s + duration_s / 2 - time.time()))
            sandbox.app_state.configure("flaky", THROTTLING)

        for label, sources in (("baseline", HEALTHY), ("with_failing", (*HEALTHY, FAILING))):
            sandbox.app_state.configure("flaky", STALLING)
            sandbox.app_state.reset()
            store_url = f"sqlite:///{Path(tmp) / label}.db"
            result = run_workers(plans_for(sources, sandbox.url, store_url), duration_s=duration_s,
                                 during=throttle_at_half_time if FAILING in sources else None)
            runs[label] = run_figures(result, sources, sandbox.app_state.snapshot())
            errors += result.errors()
        # Stopping the sandbox cancels the stalls still in flight, which uvicorn logs as tracebacks.
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
    alone, beside = runs["baseline"], runs["with_failing"]
    ratios = {s: _ratio(beside[s]["ok_per_s"], alone[s]["ok_per_s"]) for s in HEALTHY}
    ratios["all_healthy"] = _ratio(sum(beside[s]["ok_per_s"] for s in HEALTHY),
                                   sum(alone[s]["ok_per_s"] for s in HEALTHY))
    return {
        "bench": NAME,
        "started_at": datetime.now(UTC).isoformat(),
        "duration_s": duration_s,
        "engine": engine,
        "host": {"before": load_before, "after": host_load()},
        "setup": {"workers_per_source": WORKERS, "threads_per_worker": THREADS, "failing_timeout_s": 1.0,
                  "failing_route": "flaky", "stalling": STALLING, "throttling": THROTTLING,
                  "failing_switch_at_s": duration_s / 2},
        "goals": {"healthy_throughput_ratio_min": GOAL_RATIO},
        "healthy_throughput_ratio": ratios,
        "meets_goal": all(r is not None and r >= GOAL_RATIO for r in ratios.values()),
        "runs": runs,
        "errors": errors,
    }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def report(figures: dict[str, Any]) -> None:
    """Print the healthy sources' throughput side by side, then what the failing source went through."""
    base, with_failing = figures["runs"]["baseline"], figures["runs"]["with_failing"]
    ratios = figures["healthy_throughput_ratio"]
    print(f"\nIsolation: {figures['duration_s']:g} s per run, {WORKERS} worker processes x {THREADS} "
          f"threads per source, one shared SQLite store per run; engine {figures['engine']}")
    rows: list[list[Any]] = [[s, base[s]["ok_per_s"], with_failing[s]["ok_per_s"], ratios[s]]
                             for s in HEALTHY]
    rows.append(["all healthy", sum(base[s]["ok_per_s"] for s in HEALTHY),
                 sum(with_failing[s]["ok_per_s"] for s in HEALTHY), ratios["all_healthy"]])
    print_table(f"Healthy throughput, completed fetches/s (goal: ratio >= {GOAL_RATIO})",
                ["source", "alone", "beside failing", "ratio"], rows)
    failing = with_failing[FAILING]
    half_s = figures["duration_s"] / 2
    print_table("The failing source beside them (status 0 = no answer: timed out)",
                ["phase", "attempts", "attempts/s", "statuses seen"],
                [[phase, sum(counts.values()), sum(counts.values()) / half_s, counts]
                 for phase, counts in failing["status_counts_by_phase"].items()])
    print(f"  failing source fetch outcomes: {failing['fetch_outcomes']}")
    print(f"\n  healthy sources keep >= {GOAL_RATIO} of their throughput: {figures['meets_goal']}")
    report_host(figures)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench.isolation [--duration-s S] [--results-dir DIR]`."""
    args = parse_args(argv, description=__doc__.splitlines()[0], default_duration_s=DEFAULT_DURATION_S)
    figures = run(args.duration_s)
    report(figures)
    return finish(NAME, figures, args.results_dir)


if __name__ == "__main__":
    sys.exit(main())
