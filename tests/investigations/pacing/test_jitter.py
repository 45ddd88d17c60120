"""Jitter: heavy-tailed gaps whose mean stays at the permitted interval, and jittered start times."""

from __future__ import annotations

import bisect
import cmath
import random
import statistics

import pytest

from investigations.pacing import GapSampler, jittered_start_s
from investigations.pacing.jitter import send_delay_s

DRAWS = 200_000
INTERVAL_S = 0.5


def draws(sampler: GapSampler, n: int = DRAWS) -> list[float]:
    return [sampler.gap_s(INTERVAL_S) for _ in range(n)]


def test_mean_gap_including_pauses_is_between_the_interval_and_15_percent_above() -> None:
    mean = statistics.fmean(draws(GapSampler(random.Random(1))))
    assert INTERVAL_S <= mean <= 1.15 * INTERVAL_S


def test_mean_matches_the_analytic_target_of_mean_ratio() -> None:
    mean = statistics.fmean(draws(GapSampler(random.Random(2), mean_ratio=1.0)))
    assert mean == pytest.approx(INTERVAL_S, rel=0.01)


def test_gaps_vary_far_more_than_uniform_jitter_does() -> None:
    gaps = draws(GapSampler(random.Random(3)))
    rng = random.Random(3)
    uniform = [INTERVAL_S * rng.uniform(0.5, 1.5) for _ in range(DRAWS)]  # the mechanical baseline

    def cv(xs: list[float]) -> float:
        return statistics.pstdev(xs) / statistics.fmean(xs)

    assert cv(uniform) < 0.3
    assert cv(gaps) > 0.5


@pytest.mark.parametrize("probability", [0.01, 0.03, 0.1])
def test_long_pauses_occur_at_the_configured_probability(probability: float) -> None:
    # A narrow lognormal body never reaches 3 x interval, so every gap that long is a pause.
    gaps = draws(GapSampler(random.Random(4), sigma=0.1, pause_probability=probability))
    share = sum(gap >= 3.0 * INTERVAL_S for gap in gaps) / DRAWS
    assert share == pytest.approx(probability, abs=0.003)


def test_a_gap_is_linear_in_the_interval() -> None:
    # The rate lanes rely on this: they draw gap_s(1.0) and scale it inside their SQL statement.
    unit = GapSampler(random.Random(5)).gap_s(1.0)
    assert GapSampler(random.Random(5)).gap_s(2.0) == pytest.approx(2.0 * unit)


def test_pauses_that_alone_exceed_the_mean_are_refused() -> None:
    with pytest.raises(ValueError, match="pauses alone"):
        GapSampler(random.Random(6), pause_probability=0.5, pause_range=(3.0, 10.0))


def test_jittered_start_stays_within_the_spread_of_the_period() -> None:
    rng = random.Random(7)
    offsets = [jittered_start_s(60.0, rng=rng, spread=0.1) for _ in range(10_000)]
    assert all(0.0 <= offset < 6.0 for offset in offsets)
    assert min(offsets) < 0.1 and max(offsets) > 5.9  # it uses the whole range, not one corner


def _saturated_sends(sampler: GapSampler, n: int = 50_000) -> list[float]:
    """Sends of a lane kept busy: slot k opens at k x interval, the send leaves its delay later."""
    return sorted(k * INTERVAL_S + send_delay_s(sampler, INTERVAL_S) for k in range(n))


def test_send_delays_keep_the_mean_gap_at_the_interval() -> None:
    sends = _saturated_sends(GapSampler(random.Random(8)))
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert statistics.fmean(gaps) == pytest.approx(INTERVAL_S, rel=0.01)


def test_send_gaps_are_irregular_and_heavy_tailed() -> None:
    sends = _saturated_sends(GapSampler(random.Random(9)))
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    rng = random.Random(9)
    uniform = [INTERVAL_S * rng.uniform(0.5, 1.5) for _ in range(len(gaps))]  # a fixed-delay fleet's gaps
    assert cv > 1.5 * statistics.pstdev(uniform) / statistics.fmean(uniform)
    assert max(gaps) > 3 * INTERVAL_S  # the occasional long pause


def test_a_window_never_holds_more_than_one_send_above_its_slots_without_pauses() -> None:
    sends = _saturated_sends(GapSampler(random.Random(10), pause_probability=0.0), n=20_000)
    window = 10 * INTERVAL_S
    busiest = max(bisect.bisect_left(sends, t + window) - i for i, t in enumerate(sends))
    assert busiest <= 10 + 1


def test_the_period_of_the_slots_is_blurred_in_the_sends() -> None:
    def peak(sends: list[float]) -> float:
        # |mean of e^(2 pi i t / interval)|: 1 for a strict rhythm, 0 for no trace of the period.
        return abs(sum(cmath.exp(2j * cmath.pi * t / INTERVAL_S) for t in sends)) / len(sends)

    rng = random.Random(11)
    uniform = sorted(k * INTERVAL_S + INTERVAL_S * rng.uniform(-0.1, 0.1) for k in range(20_000))
    assert peak(uniform) > 0.9  # a fixed slot with +-10 % jitter still beats at the interval
    assert peak(_saturated_sends(GapSampler(random.Random(12)), n=20_000)) < 0.35


def test_a_sampler_without_spread_or_pauses_adds_no_delay() -> None:
    exact = GapSampler(random.Random(13), sigma=0.0, pause_probability=0.0)
    assert {send_delay_s(exact, INTERVAL_S) for _ in range(100)} == {0.0}
