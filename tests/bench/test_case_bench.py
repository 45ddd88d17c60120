"""The case bench's pure parts: the bound, the completion summary, the delivery, the sources, the limiter,
the fresh leads' plan, matching and summary.

Fast and process-free; the bench itself (a fleet, nginx, tinyproxy) runs under `soak` only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.case import (
    CALM,
    FOUR_RATES,
    SOURCE,
    bound_ratio,
    bound_s,
    calm_setup,
    case_done_s,
    case_sources_yaml,
    cell_text,
    completion_summary,
    delivery_body,
    first_arrival,
    fresh_plan,
    goal_met,
    latency_summary,
    lead_values,
    limiter,
    mode_setups,
    query_values,
    rate_name,
    ratio_text,
    within_goal,
)
from bench.nginx import LogRow, _config
from investigations.intake.app import parse_delivery
from investigations.sources.specs import parse_sources

ROOT = Path(__file__).resolve().parents[2]
ARGS = SimpleNamespace(concurrency=16, site_rate=30.0, client_rate=5.0, identities=8)


def test_the_bound_is_one_and_a_half_times_the_ceilings_time_plus_ten_seconds() -> None:
    assert bound_s(300, 30.0) == pytest.approx(25.0)
    assert bound_s(200, 1.5) == pytest.approx(210.0)
    one = mode_setups("one", ARGS)[0]
    assert one.ceiling(8) == 30.0  # min(site 30, 8 x 5)
    assert one.ceiling(4) == 20.0  # min(site 30, 4 x 5): too few identities bound it


def test_four_sources_at_their_rates_each_bound_by_its_own_site_zone() -> None:
    setups = mode_setups("four", ARGS)
    assert [s.site_rate for s in setups] == list(FOUR_RATES)
    assert [s.name for s in setups] == ["rate_20", "rate_10", "rate_5", "rate_1_5"]
    assert [s.ceiling(8) for s in setups] == list(FOUR_RATES)
    assert [bound_s(200, s.ceiling(8)) for s in setups] == pytest.approx([25.0, 40.0, 70.0, 210.0])
    assert [s.concurrency for s in setups] == [11, 6, 3, 2]  # 16 scaled by rate / 30, at least 2
    assert rate_name(1.5) == "rate_1_5"


def test_summary_of_stored_leads_is_exact_nearest_rank() -> None:
    summary = completion_summary([float(n) for n in range(1, 21)], waited_s=60.0)
    assert (summary["n"], summary["stored"], summary["unfinished"]) == (20, 20, 0)
    assert summary["first"] == {"s": 1.0, "lower_bound": False}
    assert summary["p50"] == {"s": 10.0, "lower_bound": False}
    assert summary["p95"] == {"s": 19.0, "lower_bound": False}
    assert summary["all"] == {"s": 20.0, "lower_bound": False}


def test_unfinished_leads_count_as_lower_bounds_at_the_time_waited() -> None:
    summary = completion_summary([5.0, 7.0, None, 9.0, None], waited_s=30.0)
    assert (summary["stored"], summary["unfinished"]) == (3, 2)
    assert summary["first"] == {"s": 5.0, "lower_bound": False}
    assert summary["p50"] == {"s": 9.0, "lower_bound": False}
    assert summary["all"] == {"s": 30.0, "lower_bound": True}
    assert cell_text(summary["all"]) == ">30.0" and cell_text(summary["p50"]) == "9.0"
    # A bound below a stored value (the bench gave up before it): that value is not exact either.
    odd = completion_summary([40.0, None], waited_s=30.0)
    assert odd["all"] == {"s": 40.0, "lower_bound": True}
    assert completion_summary([None, None], waited_s=12.0)["first"] == {"s": 12.0, "lower_bound": True}
    assert completion_summary([], waited_s=1.0)["all"] is None


def test_ratio_and_goal_know_when_all_is_a_lower_bound() -> None:
    exact = bound_ratio(25.0, {"s": 20.0, "lower_bound": False})
    assert exact == {"value": 1.25, "upper_bound": False} and goal_met(exact) == "met"
    slow = bound_ratio(25.0, {"s": 50.0, "lower_bound": False})
    assert goal_met(slow) == "NOT met" and ratio_text(slow) == "0.50"
    gave_up = bound_ratio(25.0, {"s": 240.0, "lower_bound": True})
    assert goal_met(gave_up) == "NOT met" and ratio_text(gave_up) == "<0.10"
    too_soon = bound_ratio(25.0, {"s": 20.0, "lower_bound": True})  # gave up before the bound: unknown
    assert goal_met(too_soon) == "-"
    assert goal_met(None) == "-" and bound_ratio(25.0, None) is None


def test_the_delivery_is_one_valid_case_of_distinct_interactive_leads() -> None:
    setups = mode_setups("four", ARGS)
    urls = {s.name: f"http://127.0.0.1:{9000 + n}" for n, s in enumerate(setups)}
    catalog = parse_sources(case_sources_yaml(setups, urls), env={})
    values = lead_values("four", 200)
    body = delivery_body("case-x", values, [s.name for s in setups])
    assert len(set(values)) == 200 and len(json.dumps(body)) < 1_000_000
    delivery = parse_delivery(body, catalog=catalog)
    assert delivery.case_id == "case-x" and len(delivery.leads) == 200
    assert delivery.sources == [s.name for s in setups]
    assert delivery.priority_class.value == "interactive"


def test_each_measured_source_is_configured_to_its_limiter() -> None:
    setups = mode_setups("four", ARGS)
    urls = {s.name: f"http://127.0.0.1:{9000 + n}" for n, s in enumerate(setups)}
    catalog = parse_sources(case_sources_yaml(setups, urls), env={})
    for setup in setups:
        spec = catalog.get(setup.name)
        assert spec.request.url.startswith(urls[setup.name] + "/robust/")
        assert (spec.rate.source_per_s, spec.rate.source_burst) == (setup.site_rate, setup.site_burst - 1)
        assert (spec.rate.identity_per_s, spec.rate.identity_burst) == (setup.client_rate, setup.client_burst - 1)
        assert spec.concurrency == setup.concurrency
    assert not catalog.get(SOURCE).request.url.startswith("http://127.0.0.1:90")  # robust as the repo has it
    one = mode_setups("one", ARGS)
    spec = parse_sources(case_sources_yaml(one, {SOURCE: "http://127.0.0.1:9999"}), env={}).get(SOURCE)
    assert spec.request.url.startswith("http://127.0.0.1:9999/robust/")
    assert (spec.rate.source_per_s, spec.rate.identity_per_s, spec.concurrency) == (30.0, 5.0, 16)


def test_each_source_gets_an_nginx_server_at_its_own_rates(tmp_path: Path) -> None:
    setups = [*mode_setups("four", ARGS), calm_setup(ARGS)]
    limiters = [limiter(setup) for setup in setups]
    slowest = limiters[3]
    assert (slowest.name, slowest.rate_per_s, slowest.site_rate_per_s, slowest.burst, slowest.site_burst) == (
        "rate_1_5", 1.5, 1.5, 2, 5)
    conf = _config(tmp_path, limiters, {lim.name: 9000 + n for n, lim in enumerate(limiters)}, "127.0.0.1:1")
    assert "zone=rate_20:1m rate=20r/s;" in conf and "zone=rate_20_site:1m rate=20r/s;" in conf
    assert "zone=rate_1_5:1m rate=90r/m;" in conf and "zone=rate_1_5_site:1m rate=90r/m;" in conf
    assert "zone=calm:1m rate=10r/s;" in conf and "zone=calm_site:1m rate=10r/s;" in conf
    one = limiter(mode_setups("one", ARGS)[0])
    assert "zone=robust:1m rate=5r/s;" in _config(tmp_path, [one], {SOURCE: 9000}, "127.0.0.1:1")


def test_calm_is_a_copy_of_robust_behind_its_own_generous_limiter_and_not_in_the_case() -> None:
    one, calm = mode_setups("one", ARGS)[0], calm_setup(ARGS)
    assert (calm.name, calm.site_rate, calm.client_rate, calm.concurrency) == (CALM, 10.0, 10.0, 6)
    assert calm.ceiling(8) == 10.0
    urls = {SOURCE: "http://127.0.0.1:9001", CALM: "http://127.0.0.1:9002"}
    catalog = parse_sources(case_sources_yaml([one, calm], urls), env={})
    spec = catalog.get(CALM)
    assert spec.request.url.startswith("http://127.0.0.1:9002/robust/")
    assert "domain" in spec.lead_kinds
    assert (spec.rate.source_per_s, spec.rate.identity_per_s, spec.concurrency) == (10.0, 10.0, 6)
    assert catalog.get(SOURCE).request.url.startswith("http://127.0.0.1:9001/robust/")
    # A fresh lead's delivery: one lead, its own case, interactive, for either source.
    delivery = parse_delivery(delivery_body("case-x-fresh-000", ["fresh-one-000.example"], [CALM]), catalog=catalog)
    assert delivery.sources == [CALM] and len(delivery.leads) == 1
    assert delivery.priority_class.value == "interactive"


def test_fresh_leads_are_spread_over_the_bursts_expected_time_taking_the_sources_in_turn() -> None:
    plan = fresh_plan(10, leads=300, ceiling_per_s=30.0, sources=(SOURCE, CALM), seed=1, mode="one",
                      case_id="case-x")
    assert len(plan) == 10
    offsets = [lead.offset_s for lead in plan]
    assert offsets == sorted(offsets) and all(1.0 <= o <= 8.0 for o in offsets)  # [1, 0.8 x 300 / 30]
    assert [lead.source for lead in plan] == [SOURCE, CALM] * 5
    assert len({lead.value for lead in plan}) == 10 and len({lead.case_id for lead in plan}) == 10
    assert not {lead.value for lead in plan} & set(lead_values("one", 300))
    assert all(lead.case_id.startswith("case-x-fresh-") for lead in plan)
    again = fresh_plan(10, leads=300, ceiling_per_s=30.0, sources=(SOURCE, CALM), seed=1, mode="one",
                       case_id="case-x")
    assert again == plan  # seeded
    other = fresh_plan(10, leads=300, ceiling_per_s=30.0, sources=(SOURCE, CALM), seed=2, mode="one",
                       case_id="case-x")
    assert [lead.offset_s for lead in other] != offsets
    tiny = fresh_plan(3, leads=5, ceiling_per_s=30.0, sources=(SOURCE, CALM), seed=1, mode="one", case_id="c")
    assert [lead.offset_s for lead in tiny] == [1.0, 1.0, 1.0]  # a burst shorter than a second: all at 1 s
    assert fresh_plan(0, leads=300, ceiling_per_s=30.0, sources=(SOURCE, CALM), seed=1, mode="one",
                      case_id="c") == []


def test_a_fresh_leads_first_request_is_matched_by_its_value_in_the_logged_url() -> None:
    uri = "/robust/api/lookup?kind=domain&q=fresh-one-001.example"
    assert query_values(uri) == {"domain", "fresh-one-001.example"}
    assert query_values("/robust/api/lookup?kind=domain&q=a%2Db.example") == {"domain", "a-b.example"}
    rows = [
        LogRow(100.0, 200, "127.0.0.2", 0.010, "/robust/api/lookup?kind=domain&q=case-one-00001.example"),
        LogRow(101.5, 429, "127.0.0.3", 0.000, "/robust/api/lookup?kind=domain&q=fresh-one-0010.example"),
        LogRow(102.0, 200, "127.0.0.4", 0.250, uri),
        LogRow(103.0, 200, "127.0.0.5", 0.001, uri),
    ]
    # The first one asking for that value, not one whose value merely starts the same; at its arrival.
    assert first_arrival(rows, "fresh-one-001.example") == pytest.approx(101.75)
    assert first_arrival(rows, "fresh-one-0010.example") == pytest.approx(101.5)
    assert first_arrival(rows, "fresh-one-002.example") is None


def test_fresh_latencies_summarize_with_unfinished_leads_as_lower_bounds_and_the_goal() -> None:
    done = latency_summary([(0.5, 30.0), (1.0, 30.0), (2.0, 30.0), (3.0, 30.0), (3.5, 30.0)])
    assert (done["n"], done["done"], done["unfinished"]) == (5, 5, 0)
    assert done["p50"] == {"s": 2.0, "lower_bound": False}
    assert done["p95"] == done["max"] == {"s": 3.5, "lower_bound": False}
    assert within_goal(done["p95"], 4.0) == "met"
    late = latency_summary([(0.5, 30.0), (None, 20.0), (2.0, 30.0)])
    assert late["unfinished"] == 1 and late["p95"] == {"s": 20.0, "lower_bound": True}
    assert within_goal(late["p95"], 4.0) == "NOT met"  # a lower bound above the goal: not met whatever it is
    early = latency_summary([(0.5, 30.0), (None, 3.0), (2.0, 30.0)])  # the bench stopped within the goal
    assert early["p95"] == {"s": 3.0, "lower_bound": True} and within_goal(early["p95"], 4.0) == "-"
    assert within_goal(latency_summary([(5.0, 9.0)])["p95"], 4.0) == "NOT met"
    assert latency_summary([])["p95"] is None and within_goal(None, 4.0) == "-"


def test_the_case_is_done_when_its_last_lead_is_stored() -> None:
    figures = {"sources": {"a": {"completion_s": {"all": {"s": 9.0, "lower_bound": False}}},
                           "b": {"completion_s": {"all": {"s": 12.0, "lower_bound": False}}}}}
    assert case_done_s(figures, accepted_s=100.0, end_s=113.0) == 112.0
    figures["sources"]["b"]["completion_s"]["all"]["lower_bound"] = True  # gave up: done when it stopped
    assert case_done_s(figures, accepted_s=100.0, end_s=113.0) == 113.0


@pytest.mark.soak
def test_case_bench_runs_end_to_end(tmp_path: Path) -> None:
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").is_file()):
        pytest.skip("nginx is not installed (apt-get install -y nginx-light); the case bench needs it")
    if not (shutil.which("tinyproxy") or Path("/usr/sbin/tinyproxy").is_file()):
        pytest.skip("tinyproxy is not installed (apt-get install -y tinyproxy); the case bench needs it")
    done = subprocess.run(
        [sys.executable, "-m", "bench.case", "--modes", "one", "--leads", "5", "--engine-s", "3",
         "--timeout-s", "180", "--results-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads((tmp_path / "case.json").read_text())
    assert {"config", "modes", "engine", "goals", "engine_version"} <= set(figures)
    robust = figures["modes"]["one"]["sources"][SOURCE]
    assert {"bound_s", "completion_s", "bound_over_all", "refused_429", "case_runs", "leads_per_run"} <= set(robust)
    assert {"fleet_cpu_per_collection_s", "factor", "goal"} <= set(figures["modes"]["one"]["cpu"])
    fresh = figures["modes"]["one"]["fresh"]
    assert set(fresh["sources"]) == {SOURCE, CALM} and len(fresh["leads"]) == 10
    assert {"first_request_s", "stored_s", "goal_first_request_p95"} <= set(fresh["sources"][CALM])
    assert set(figures["goals"]["one"]["fresh_first_request_p95"]) == {SOURCE, CALM}
