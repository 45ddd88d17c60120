"""The cadence bench runs end to end on a short simulated span and writes its figures; the learned
cadence at equal requests spends what the fixed one does, and the equal-freshness run is as fresh.

Its figures over the full month are read by people (`python -m bench.cadence`), not asserted here."""

from __future__ import annotations

import json
from pathlib import Path

from bench import cadence


def test_the_cadence_bench_compares_the_policies_and_writes_its_figures(tmp_path: Path) -> None:
    assert cadence.main(["--leads", "40", "--days", "4", "--tick-s", "600", "--results-dir", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "cadence.json").read_text())
    assert {"bench", "engine", "host", "started_at", "config", "policies", "goals", "meets_goals", "errors",
            "delay_ratio_at_equal_requests", "request_ratio_at_equal_freshness"} <= set(figures)
    policies = figures["policies"]
    assert set(policies) == {"fixed", "learned_equal_requests", "learned_equal_freshness"}
    fixed, same_requests, same_freshness = (policies[name] for name in policies)
    assert fixed["requests"] == 40 * 4 * 4  # every lead every 6 h
    assert abs(same_requests["request_ratio"] - 1) < 0.05
    assert same_freshness["freshness"] >= fixed["freshness"] and same_freshness["request_ratio"] < 1
    assert figures["delay_ratio_at_equal_requests"] == same_requests["delay_ratio"]


def test_the_same_seed_gives_the_same_figures() -> None:
    first = cadence.run(leads=20, days=2, tick_s=900, seed=5)["policies"]
    assert first == cadence.run(leads=20, days=2, tick_s=900, seed=5)["policies"]
