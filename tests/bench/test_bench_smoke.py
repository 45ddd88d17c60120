"""Each bench runs end to end for a few seconds and writes its figures with the expected keys.

A smoke test of the bench machinery (spawned workers, nginx, the JSON), not of the figures: those
need the full durations and are read by people, not asserted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DURATION_S = "4"

EXPECTED = {
    "pacing": {"limiter", "fleet_config", "fleets", "goals", "paced_meets_goals", "errors"},
    "isolation": {"healthy_throughput_ratio", "runs", "goals", "meets_goal", "errors"},
    "convergence": {"before_change", "after_change", "achieved", "timeline", "rate_factors_at_end", "errors"},
}


def run_bench(name: str, results: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--duration-s", DURATION_S, "--results-dir", str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads((results / f"{name}.json").read_text())
    assert figures["bench"] == name and figures["duration_s"] == float(DURATION_S)
    expected = EXPECTED[name] | {"engine", "host", "started_at"}
    assert expected <= set(figures), sorted(expected - set(figures))
    return figures


@pytest.mark.soak
def test_pacing_bench_writes_each_fleets_figures(tmp_path: Path) -> None:
    # bench/ is not an installed package (it runs from the project root), so look nginx up here.
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").is_file()):
        pytest.skip("nginx is not installed (apt-get install -y nginx-light); the pacing bench needs it")
    figures = run_bench("pacing", tmp_path)
    assert set(figures["fleets"]) == {"paced", "fixed_delay", "naive"}
    for fleet in figures["fleets"].values():
        assert {"sustained_over_permitted", "limiter_rejections", "sent", "lanes"} <= set(fleet)
        assert {"gap_cv", "peak_ratio", "peak_period_s", "noise_peak_ratio"} <= set(fleet["lanes"]["source"])
        assert fleet["sent"] > 0


@pytest.mark.soak
def test_isolation_bench_writes_healthy_ratios(tmp_path: Path) -> None:
    figures = run_bench("isolation", tmp_path)
    assert set(figures["healthy_throughput_ratio"]) == {"robust", "slow", "quiet", "all_healthy"}
    assert set(figures["runs"]) == {"baseline", "with_failing"}


@pytest.mark.soak
def test_convergence_bench_writes_settling_figures(tmp_path: Path) -> None:
    figures = run_bench("convergence", tmp_path)
    assert {"converged_after_s", "first_quiet_after_s", "throttled"} <= set(figures["after_change"])
    assert {"ok_per_s", "over_new_limit"} <= set(figures["achieved"])


def test_a_cpu_group_with_two_roots_counts_both_trees_once() -> None:
    import subprocess
    import sys
    import time

    from bench.fleet_process import CpuSampler, read_stat

    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all((stat := read_stat(proc.pid)) and stat.self_s >= 0.3
                                                      for proc in procs):
            time.sleep(0.1)  # until both have burnt their 0.3 s and sleep
        time.sleep(0.2)
        sample = CpuSampler({"both": [procs[0].pid, procs[1].pid, procs[0].pid], "one": procs[1].pid}).sample()
        assert 0.6 <= sample.totals["both"] < 1.2  # both trees, the repeated root once
        assert 0.3 <= sample.totals["one"] < 0.6
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
