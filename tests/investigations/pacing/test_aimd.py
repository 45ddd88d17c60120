"""AIMD with a remembered ceiling: one cut per throttle episode, a fast climb back to just under the
factor that was throttled, a hold there, then slow probing towards the configured rate.
"""

from __future__ import annotations

import random

import pytest

from investigations.collection.events import Outcome
from investigations.pacing import aimd
from investigations.pacing.aimd import AimdState
from investigations.sources.specs import ThrottleSpec

SPEC = ThrottleSpec(decrease_factor=0.5, increase_step=0.1, min_factor=0.1, cut_hold_s=2.0, ceiling_margin=0.1,
                    ceiling_hold_s=60.0, probe_step=0.01)
NOW = 10_000.0
LONG_AGO = NOW - 1_000.0


def same(actual: AimdState, expected: AimdState) -> bool:
    return (actual.rate_factor, actual.ceiling_factor, actual.last_cut_s) == pytest.approx(
        (expected.rate_factor, expected.ceiling_factor, expected.last_cut_s))


@pytest.mark.parametrize(
    ("factor", "expected"),
    [
        (1.0, 0.5),  # halved
        (0.5, 0.25),
        (0.3, 0.15),
        (0.15, 0.1),  # would be 0.075: floored at min_factor
        (0.1, 0.1),  # already at the floor
    ],
)
def test_decrease(factor: float, expected: float) -> None:
    assert aimd.decrease(factor, SPEC) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(AimdState(), AimdState(0.5, 1.0, NOW), id="first-cut-of-a-fresh-lane"),
        pytest.param(AimdState(0.6, 1.0, LONG_AGO), AimdState(0.3, 0.6, NOW), id="records-the-factor-it-hit"),
        pytest.param(AimdState(0.7, 0.6, LONG_AGO), AimdState(0.35, 0.7, NOW), id="a-probe-above-the-ceiling-raises-it"),
        pytest.param(AimdState(0.15, 0.8, LONG_AGO), AimdState(0.1, 0.15, NOW), id="floored-at-min-factor"),
        pytest.param(AimdState(0.1, 0.2, LONG_AGO), AimdState(0.1, 0.1, NOW), id="already-at-the-floor"),
        pytest.param(AimdState(0.5, 1.0, NOW - 2.0), AimdState(0.25, 0.5, NOW), id="cuts-again-once-the-hold-is-over"),
    ],
)
def test_a_throttle_outside_the_cut_hold_cuts_and_remembers_the_ceiling(before: AimdState, after: AimdState) -> None:
    assert same(aimd.on_throttle(before, NOW, SPEC), after)


@pytest.mark.parametrize("since_cut_s", [0.0, 0.5, 1.99])
def test_a_throttle_within_the_cut_hold_changes_nothing(since_cut_s: float) -> None:
    state = AimdState(0.5, 1.0, NOW - since_cut_s)
    assert aimd.on_throttle(state, NOW, SPEC) == state


def test_a_burst_of_throttles_from_requests_in_flight_cuts_once() -> None:
    state = AimdState()
    for n in range(8):
        state = aimd.on_throttle(state, NOW + n * 0.2, SPEC)
    assert same(state, AimdState(0.5, 1.0, NOW))


@pytest.mark.parametrize(
    ("before", "factor_after"),
    [
        pytest.param(AimdState(0.3, 0.6, NOW - 1.0), 0.4, id="below-the-target-climbs-by-increase-step"),
        pytest.param(AimdState(0.5, 0.6, NOW - 1.0), 0.54, id="the-climb-stops-at-the-target"),
        pytest.param(AimdState(0.54, 0.6, NOW - 1.0), 0.54, id="holds-at-the-target-after-a-cut"),
        pytest.param(AimdState(0.54, 0.6, NOW - 59.9), 0.54, id="still-holding-just-before-ceiling-hold"),
        pytest.param(AimdState(0.54, 0.6, NOW - 60.0), 0.55, id="probes-by-probe-step-after-ceiling-hold"),
        pytest.param(AimdState(0.7, 0.6, LONG_AGO), 0.71, id="probing-goes-past-the-old-ceiling"),
        pytest.param(AimdState(0.995, 1.0, LONG_AGO), 1.0, id="probing-stops-at-the-configured-rate"),
        pytest.param(AimdState(), 1.0, id="a-fresh-lane-stays-at-the-configured-rate"),
        pytest.param(AimdState(0.1, 0.1, NOW - 1.0), 0.1, id="at-the-floor-under-a-floor-ceiling-holds"),
    ],
)
def test_a_success(before: AimdState, factor_after: float) -> None:
    after = aimd.on_success(before, NOW, SPEC)
    assert after.rate_factor == pytest.approx(factor_after)
    assert (after.ceiling_factor, after.last_cut_s) == (before.ceiling_factor, before.last_cut_s)


def test_after_a_cut_successes_climb_fast_to_the_target_then_hold_then_probe_up_to_one() -> None:
    state = aimd.on_throttle(AimdState(0.8, 1.0, LONG_AGO), NOW, SPEC)  # ceiling 0.8, factor 0.4
    climb = []
    for n in range(5):
        state = aimd.on_success(state, NOW + n, SPEC)
        climb.append(state.rate_factor)
    assert climb == pytest.approx([0.5, 0.6, 0.7, 0.72, 0.72])  # 0.72: 10 % under the ceiling
    assert aimd.on_success(state, NOW + 59.0, SPEC).rate_factor == pytest.approx(0.72)
    for n in range(40):
        state = aimd.on_success(state, NOW + 60.0 + n, SPEC)
    assert state.rate_factor == pytest.approx(1.0)  # 28 probe steps of 0.01, then capped


def test_the_factor_never_leaves_min_factor_to_one_whatever_the_sequence() -> None:
    rng, state, now = random.Random(7), AimdState(), NOW
    for _ in range(5_000):
        now += rng.expovariate(1.0) * rng.choice([0.1, 1.0, 30.0])
        state = (aimd.on_throttle if rng.random() < 0.3 else aimd.on_success)(state, now, SPEC)
        assert SPEC.min_factor <= state.rate_factor <= 1.0
        assert SPEC.min_factor <= state.ceiling_factor <= 1.0


@pytest.mark.parametrize(
    ("outcome", "timed_out", "expected"),
    [
        (Outcome.THROTTLED, False, True),
        (Outcome.TRANSIENT, True, True),  # an overloaded source stops answering before it refuses
        (Outcome.TRANSIENT, False, False),  # a 5xx or a reset says nothing about our rate
        (Outcome.OK, False, False),
        (Outcome.BLOCKED, False, False),  # the identity's problem, not the rate's
        (Outcome.PERMANENT, False, False),
    ],
)
def test_is_throttle_signal(outcome: Outcome, timed_out: bool, expected: bool) -> None:
    assert aimd.is_throttle_signal(outcome, timed_out=timed_out) is expected


@pytest.mark.parametrize(
    ("sent_as_identity", "others_cut", "others", "expected"),
    [
        (False, 0, 0, True),  # no identity: the shared lanes are the only ones it travelled
        (True, 0, 7, False),  # no other identity cut within corroborate_s: a limit on this address
        (True, 1, 7, False),  # one other in a pool of eight: two addresses' own limits, by chance
        (True, 2, 7, True),  # three identities refused within seconds: the site refuses everyone
        (True, 1, 1, True),  # a pool of two: the other one is all the corroboration there can be
        (True, 0, 0, False),  # the only identity that has sent: its lane alone is cut
    ],
)
def test_cuts_shared_lanes(sent_as_identity: bool, others_cut: int, others: int, expected: bool) -> None:
    spec = ThrottleSpec(corroborate_s=3.0, corroborate_identities=3)
    assert aimd.cuts_shared_lanes(sent_as_identity=sent_as_identity, others_cut=others_cut, others=others,
                                  spec=spec) is expected
    # The site said when to come back: every lane obeys, corroborated or not.
    assert aimd.cuts_shared_lanes(sent_as_identity=sent_as_identity, others_cut=others_cut, others=others,
                                  spec=spec, retry_after=True) is True


def test_a_throttle_at_or_under_the_fair_share_only_marks_the_lane() -> None:
    state = AimdState(0.5, 0.8, LONG_AGO)
    after = aimd.on_throttle(state, NOW, SPEC, fair_share=0.5)
    assert (after.rate_factor, after.ceiling_factor, after.last_cut_s) == (0.5, 0.8, NOW)


def test_a_cut_stops_at_the_fair_share() -> None:
    after = aimd.on_throttle(AimdState(1.0, 1.0, LONG_AGO), NOW, SPEC, fair_share=0.6)
    assert (after.rate_factor, after.ceiling_factor) == (0.6, 1.0)


@pytest.mark.parametrize(("shared", "identities", "rate", "expected"), [
    (30.0, 8, 10.0, 0.375),  # eight identities configured at 10 r/s under a site lane of 30
    (30.0, 8, 5.0, 0.75),
    (30.0, 4, 5.0, 0.0),  # together they cannot fill the site lane: a refusal is their own
    (8.0, 1, 3.0, 0.0),
    (0.0, 3, 5.0, 0.0),
])
def test_fair_share(shared: float, identities: int, rate: float, expected: float) -> None:
    assert aimd.fair_share(shared_rate_per_s=shared, identities=identities, identity_rate_per_s=rate) == \
        pytest.approx(expected)


@pytest.mark.parametrize(("share", "expected"), [
    (0.0, 1.0),  # no share to keep to: the configured rate is the only cap
    (0.4, 0.5),  # its share and a quarter more (the default share_headroom)
    (0.9, 1.0),  # never above the configured rate
])
def test_share_cap(share: float, expected: float) -> None:
    assert aimd.share_cap(share, ThrottleSpec()) == pytest.approx(expected)


def test_an_identity_climbs_and_probes_no_higher_than_its_share_cap() -> None:
    spec = ThrottleSpec(increase_step=0.1, ceiling_margin=0.1, ceiling_hold_s=60.0, probe_step=0.01)
    state, now = AimdState(0.2, 1.0, LONG_AGO), NOW
    for _ in range(200):  # long past the hold: climbing, then probing
        now += 1.0
        state = aimd.on_success(state, now, spec, fair_share=0.4)
    assert state.rate_factor == pytest.approx(0.5)
    assert state.ceiling_factor == 1.0  # what was learned stays


def test_an_identity_above_its_share_cap_is_brought_down_to_it_by_a_success() -> None:
    after = aimd.on_success(AimdState(0.9, 1.0, LONG_AGO), NOW, ThrottleSpec(), fair_share=0.4)
    assert (after.rate_factor, after.ceiling_factor, after.last_cut_s) == (pytest.approx(0.5), 1.0, LONG_AGO)


@pytest.mark.parametrize("rate", [0.5, 5.0, 60.0])
def test_probing_grows_a_lane_by_probe_step_of_itself_a_second_whatever_its_rate(rate: float) -> None:
    state, now = AimdState(0.5, 0.5, LONG_AGO), NOW
    successes = round(rate * 0.5 * 10)  # ten seconds at its rate in use
    for _ in range(successes):
        now += 1.0 / (rate * 0.5)
        state = aimd.on_success(state, now, SPEC, rate_per_s=rate)
    assert state.rate_factor == pytest.approx(0.5 + 10 * SPEC.probe_step * 0.5, rel=0.02)
