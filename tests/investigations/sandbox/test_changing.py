"""The `changing` source: each lead's answer changes as a Poisson process at a rate fixed by the lead
(hourly to never), its content a function of (lead, version), on an injected clock."""

from __future__ import annotations

import math
import statistics

import httpx
import pytest

from investigations.sandbox import SandboxConfig, start_in_thread
from investigations.sandbox.changing import FASTEST_S, NEVER_SHARE, SLOWEST_S, ChangeModel
from tests.fakes import FakeClock

T0 = 1_790_000_000.0
DAY = 86_400.0
LEADS = [f"lead{n}.example" for n in range(2_000)]


def test_rates_spread_from_hourly_to_never_and_are_fixed_by_the_lead() -> None:
    model = ChangeModel(7)
    rates = [model.rate_per_s("domain", q) for q in LEADS]
    assert rates == [ChangeModel(7).rate_per_s("domain", q) for q in LEADS]
    assert rates != [ChangeModel(8).rate_per_s("domain", q) for q in LEADS]
    never = sum(rate == 0 for rate in rates) / len(rates)
    assert never == pytest.approx(NEVER_SHARE, abs=0.03)
    changing = [math.log(rate) for rate in rates if rate]
    assert min(changing) >= math.log(1 / SLOWEST_S) and max(changing) <= math.log(1 / FASTEST_S)
    # Log-uniform: the mean log rate is the middle of the range.
    middle = (math.log(1 / SLOWEST_S) + math.log(1 / FASTEST_S)) / 2
    assert statistics.fmean(changing) == pytest.approx(middle, abs=0.25)


def test_changes_come_at_each_lead_s_rate() -> None:
    model = ChangeModel(7)
    fast = [q for q in LEADS if model.rate_per_s("domain", q) > 1 / (3 * 3_600)][:40]
    for q in fast[:5]:
        times = model.changes("domain", q, T0, T0 + 30 * DAY)
        assert times == sorted(times) and all(T0 < t <= T0 + 30 * DAY for t in times)
    # Counts over a month against the rates: Poisson, so their sum is within a few standard deviations.
    expected = sum(model.rate_per_s("domain", q) * 30 * DAY for q in fast)
    seen = sum(len(model.changes("domain", q, T0, T0 + 30 * DAY)) for q in fast)
    assert abs(seen - expected) < 4 * math.sqrt(expected)


def test_a_lead_s_version_and_answer_change_exactly_at_its_change_times() -> None:
    model = ChangeModel(7)
    q = next(q for q in LEADS if model.rate_per_s("domain", q) > 1 / (6 * 3_600))
    first, second = model.changes("domain", q, T0, T0 + 30 * DAY)[:2]
    assert model.version("domain", q, first - 1e-3) == model.version("domain", q, T0)
    assert model.version("domain", q, first) != model.version("domain", q, first - 1e-3)
    assert model.version("domain", q, second - 1e-3) == model.version("domain", q, first)
    assert model.records("domain", q, first) == model.records("domain", q, second - 1e-3)
    assert model.records("domain", q, first) != model.records("domain", q, first - 1e-3)
    # Splitting a span in two finds the same changes.
    middle = (first + second) / 2
    both = model.changes("domain", q, T0, middle) + model.changes("domain", q, middle, T0 + 30 * DAY)
    assert both == model.changes("domain", q, T0, T0 + 30 * DAY)


def test_a_lead_that_never_changes_answers_the_same_for_ever() -> None:
    model = ChangeModel(7)
    q = next(q for q in LEADS if model.rate_per_s("domain", q) == 0)
    assert model.changes("domain", q, 0.0, T0 * 2) == []
    assert model.records("domain", q, 0.0) == model.records("domain", q, T0 * 2)


def test_the_changing_route_answers_as_of_its_injected_clock() -> None:
    clock = FakeClock(T0)
    model = ChangeModel(7)
    q = next(q for q in LEADS if model.rate_per_s("domain", q) > 1 / (6 * 3_600))
    change = model.changes("domain", q, T0, T0 + 30 * DAY)[0]
    handle = start_in_thread(SandboxConfig(changing_clock=clock))
    try:
        with httpx.Client(base_url=handle.url, trust_env=False, timeout=5.0) as client:
            def answer() -> list[dict]:
                response = client.get("/changing/api/lookup", params={"kind": "domain", "q": q})
                assert response.status_code == 200
                return response.json()["results"]

            before = answer()
            assert before == model.records("domain", q, T0) and 3 <= len(before) <= 8
            clock.now = change - 1
            assert answer() == before
            clock.now = change
            assert answer() != before and answer() == model.records("domain", q, change)
            assert client.get("/_control").json()["sources"]["changing"]["requests"] == 4
    finally:
        handle.stop()
