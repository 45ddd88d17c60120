"""AIMD: a throttle signal cuts the rate factor multiplicatively, a success restores it additively."""

from __future__ import annotations

import pytest

from investigations.events import Outcome
from investigations.pacing import aimd
from investigations.specs import ThrottleSpec

SPEC = ThrottleSpec(decrease_factor=0.5, increase_step=0.1, min_factor=0.1)


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
    ("factor", "expected"),
    [
        (0.1, 0.2),  # one step up
        (0.5, 0.6),
        (0.95, 1.0),  # would be 1.05: capped at the configured rate
        (1.0, 1.0),
    ],
)
def test_increase(factor: float, expected: float) -> None:
    assert aimd.increase(factor, SPEC) == pytest.approx(expected)


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
