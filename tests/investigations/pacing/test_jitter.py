"""Jitter: slots never closer than the interval, irregular sends with no period, jittered start times."""

from __future__ import annotations

import bisect
import cmath
import itertools
import random
import statistics
from itertools import pairwise

import pytest

from investigations.pacing import GapSampler, jittered_start_s
from investigations.pacing.jitter import (
    RHYTHM_GAPS,
    RHYTHM_MIN_CV,
    RHYTHM_SHORT_GAPS,
    RHYTHM_SHORT_MIN_CV,
    THINK_MEDIAN,
)

DRAWS = 200_000
INTERVAL_S = 0.5


def slot_units(sampler: GapSampler, n: int = DRAWS) -> list[float]:
    return [sampler.slot_units() for _ in range(n)]


def test_slots_are_never_closer_than_the_interval() -> None:
    assert min(slot_units(GapSampler(random.Random(1)))) >= 1.0


def test_the_slot_slack_costs_its_configured_share_of_throughput_on_average() -> None:
    mean = statistics.fmean(slot_units(GapSampler(random.Random(2), slot_slack=0.04)))
    assert mean == pytest.approx(1.04, abs=0.002)


def test_the_slot_slack_is_heavy_tailed() -> None:
    slack = sorted(unit - 1.0 for unit in slot_units(GapSampler(random.Random(3))))
    assert slack[-len(slack) // 100] > 5 * slack[len(slack) // 2]  # the top 1 % dwarfs the median


@pytest.mark.parametrize("probability", [0.01, 0.03, 0.1])
def test_long_pauses_occur_at_the_configured_probability(probability: float) -> None:
    # A send delay is capped at one interval, so every delay of 3 intervals or more is a pause.
    sampler = GapSampler(random.Random(4), pause_probability=probability)
    share = sum(sampler.send_delay_s(INTERVAL_S) >= 3.0 * INTERVAL_S for _ in range(DRAWS)) / DRAWS
    assert share == pytest.approx(probability, abs=0.003)


def test_a_think_time_stays_within_one_period_around_a_third_of_it() -> None:
    sampler = GapSampler(random.Random(14))
    thinks = [sampler.think_s(2.0) / 2.0 for _ in range(DRAWS)]
    assert max(thinks) <= 1.0
    assert statistics.median(thinks) == pytest.approx(THINK_MEDIAN, abs=0.01)
    assert GapSampler(random.Random(15), sigma=0.0, pause_probability=0.0).think_s(2.0) == 0.0


def test_too_much_slack_is_refused() -> None:
    with pytest.raises(ValueError, match="throughput"):
        GapSampler(random.Random(6), slot_slack=0.5)


def test_jittered_start_stays_within_the_spread_of_the_period() -> None:
    rng = random.Random(7)
    offsets = [jittered_start_s(60.0, rng=rng, spread=0.1) for _ in range(10_000)]
    assert all(0.0 <= offset < 6.0 for offset in offsets)
    assert min(offsets) < 0.1 and max(offsets) > 5.9  # it uses the whole range, not one corner




def _saturated_sends(sampler: GapSampler, n: int = 50_000) -> list[float]:
    """Sends of a lane kept busy: each slot follows the last by its units, the send leaves its delay later."""
    sends, slot = [], 0.0
    for _ in range(n):
        slot += INTERVAL_S * sampler.slot_units()
        sends.append(slot + sampler.send_delay_s(INTERVAL_S))
    return sorted(sends)


def test_send_gaps_average_the_interval_plus_the_slack() -> None:
    sends = _saturated_sends(GapSampler(random.Random(8)))
    gaps = [b - a for a, b in pairwise(sends)]
    assert INTERVAL_S <= statistics.fmean(gaps) <= 1.05 * INTERVAL_S  # never faster; 4 % slack


def test_send_gaps_are_irregular_and_heavy_tailed() -> None:
    sends = _saturated_sends(GapSampler(random.Random(9)))
    gaps = [b - a for a, b in pairwise(sends)]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    rng = random.Random(9)
    uniform = [INTERVAL_S * rng.uniform(0.5, 1.5) for _ in range(len(gaps))]  # a fixed-delay fleet's gaps
    assert cv > 1.5 * statistics.pstdev(uniform) / statistics.fmean(uniform)
    assert max(gaps) > 3 * INTERVAL_S  # the occasional long pause


def test_a_window_never_holds_more_than_one_send_above_the_permitted_count_without_pauses() -> None:
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
    assert peak(_saturated_sends(GapSampler(random.Random(12)), n=20_000)) < 0.05


def test_a_sampler_without_spread_or_pauses_adds_no_delay() -> None:
    exact = GapSampler(random.Random(13), sigma=0.0, pause_probability=0.0)
    assert {exact.send_delay_s(INTERVAL_S) for _ in range(100)} == {0.0}
    assert {exact.slot_units() for _ in range(100)} == {1.0}


# -- rhythm guard ----------------------------------------------------------------------------------

REGULAR = [float(k) for k in range(RHYTHM_GAPS)]  # sends 1 s apart; the next one at RHYTHM_GAPS ends a run


def gap_cv(gaps: list[float]) -> float:
    """As a site computes it: population stdev over mean."""
    return statistics.pstdev(gaps) / statistics.fmean(gaps)


def windows_meet_their_floors(history: list[float], send: float) -> bool:
    """Every window of RHYTHM_SHORT_GAPS to RHYTHM_GAPS gaps ending at `send` has its floor's CV."""
    times = [*sorted(history)[-RHYTHM_GAPS:], send]
    gaps = [b - a for a, b in pairwise(times)]
    return all(gap_cv(gaps[-n:]) >= (RHYTHM_MIN_CV if n == RHYTHM_GAPS else RHYTHM_SHORT_MIN_CV)
               for n in range(RHYTHM_SHORT_GAPS, len(gaps) + 1))


def test_a_send_that_would_end_a_regular_run_leaves_late_enough_to_break_it() -> None:
    extra = GapSampler(random.Random(20)).rhythm_extra_s(REGULAR, RHYTHM_GAPS, 1.0)
    assert extra > 0
    assert not windows_meet_their_floors(REGULAR, RHYTHM_GAPS)
    assert windows_meet_their_floors(REGULAR, RHYTHM_GAPS + extra)


def test_the_guard_delays_at_most_one_interval_beyond_the_least_delay_that_breaks_the_run() -> None:
    least = next(k * 1e-4 for k in range(100_000) if windows_meet_their_floors(REGULAR, RHYTHM_GAPS + k * 1e-4))
    extras = [GapSampler(random.Random(seed)).rhythm_extra_s(REGULAR, RHYTHM_GAPS, 1.0) for seed in range(200)]
    assert least - 1e-4 < min(extras) and max(extras) <= least + 1.0


def test_the_guard_s_extra_is_not_a_fixed_amount() -> None:
    extras = [GapSampler(random.Random(seed)).rhythm_extra_s(REGULAR, RHYTHM_GAPS, 1.0) for seed in range(20)]
    assert len(set(extras)) >= 15  # a few may share the cap of one interval
    assert max(extras) - min(extras) > 0.25


def test_an_irregular_history_needs_no_extra() -> None:
    history = list(itertools.accumulate([0.0, 1.0, 2.1, 0.6, 1.5, 3.0, 0.7, 1.2]))
    assert GapSampler(random.Random(21)).rhythm_extra_s(history, history[-1] + 1.1, 1.0) == 0.0


def test_a_history_too_short_for_the_shortest_window_needs_no_extra() -> None:
    history = REGULAR[:RHYTHM_SHORT_GAPS - 1]
    assert GapSampler(random.Random(22)).rhythm_extra_s(history, history[-1] + 1.0, 1.0) == 0.0


def test_a_short_regular_run_is_broken_too_as_a_site_may_watch_fewer_gaps() -> None:
    history = REGULAR[:RHYTHM_SHORT_GAPS]
    extra = GapSampler(random.Random(23)).rhythm_extra_s(history, history[-1] + 1.0, 1.0)
    assert extra > 0 and windows_meet_their_floors(history, history[-1] + 1.0 + extra)


def test_the_exact_sampler_adds_no_rhythm_extra() -> None:
    exact = GapSampler(random.Random(24), sigma=0.0, pause_probability=0.0)
    assert exact.rhythm_extra_s(REGULAR, RHYTHM_GAPS, 1.0) == 0.0


def test_whatever_the_history_the_guard_only_delays_and_every_window_meets_its_floor() -> None:
    # Near-regular runs, some changing pace part-way (as a lane does when AIMD cuts its rate): the
    # windows' bands of failing gaps then lie apart, and leaving one band can land in another's.
    rng, sampler = random.Random(25), GapSampler(random.Random(26))
    for _ in range(5_000):
        spread = rng.choice([0.01, 0.05, 0.15, 0.3])
        paces = [1.0] * rng.randint(1, RHYTHM_GAPS) + [rng.choice([1.0, 1.5, 2.0])] * RHYTHM_GAPS
        gaps = [pace * rng.uniform(1 - spread, 1 + spread) for pace in paces[-RHYTHM_GAPS - 1:]]
        history = list(itertools.accumulate(gaps[:-1]))
        extra = sampler.rhythm_extra_s(history, history[-1] + gaps[-1], 1.0)
        assert extra >= 0.0
        assert windows_meet_their_floors(history, history[-1] + gaps[-1] + extra)


def test_sends_planned_after_this_one_are_not_in_its_windows() -> None:
    alone = GapSampler(random.Random(27)).rhythm_extra_s(REGULAR, RHYTHM_GAPS, 1.0)
    with_later = GapSampler(random.Random(27)).rhythm_extra_s([*REGULAR, RHYTHM_GAPS + 5.0], RHYTHM_GAPS, 1.0)
    assert with_later == alone > 0
