"""One request's pacing, rule by rule: a throttle waits without spending an attempt until it has
lasted `park_after_s` and then parks; any other answer spends an attempt and the retry policy
decides; the lanes hear every answer first, and a full lane parks the request before it is sent."""

from __future__ import annotations

import random
from pathlib import Path

from investigations.collection.events import Outcome
from investigations.pacing.lanes import Reservation
from investigations.pacing.throttle import RequestPacing
from investigations.pacing.waiting import LaneWaiter
from investigations.sources.specs import load_sources
from tests.fakes import FakeTime

ROOT = Path(__file__).resolve().parents[3]
# robust: 6 attempts, backoff from 1 s up to 20 s; throttled requests park after park_after_s.
SPEC = load_sources(ROOT / "sources.yaml").get("robust")
PARK_AFTER_S = SPEC.throttle.park_after_s


class Lanes:
    """Stands in for RateLanes: grants or refuses every reservation, and keeps what it was told."""

    def __init__(self, *, granted: bool = True, wait_s: float = 0.0, repeat: bool = False) -> None:
        self.granted, self.wait_s, self.repeat = granted, wait_s, repeat
        self.heard: list[tuple[Outcome, bool, float | None, bool]] = []

    def reserve(self, lanes, *, max_wait_s: float, max_ahead_intervals: float | None = None) -> Reservation:
        return Reservation(granted=self.granted, wait_s=self.wait_s)

    def think_s(self, period_s: float) -> float:
        return 0.0

    def feedback(self, lanes, *, outcome, timed_out, retry_after_s, throttle, pooled_identity) -> bool:
        self.heard.append((outcome, timed_out, retry_after_s, pooled_identity))
        return self.repeat


def _pacing(time: FakeTime, lanes: Lanes | None = None, *, pooled: bool = False) -> RequestPacing:
    waiter = LaneWaiter(lanes, sleep=time.sleep, clock=time.clock) if lanes is not None else None  # type: ignore[arg-type]
    return RequestPacing(SPEC, "dc1_a", waiter=waiter, pooled_identity=pooled, background=False,
                         rng=random.Random(7), clock=time.clock)


def test_an_ok_answer_is_done_and_spends_one_attempt() -> None:
    pacing = _pacing(FakeTime())
    step = pacing.after(Outcome.OK, slow_down=False, timed_out=False, retry_after_s=None)
    assert (step.action, pacing.attempts, pacing.throttled) == ("done", 1, 0)


def test_a_throttle_waits_at_least_retry_after_without_spending_an_attempt() -> None:
    pacing = _pacing(FakeTime())
    step = pacing.after(Outcome.THROTTLED, slow_down=True, timed_out=False, retry_after_s=7.0)
    assert step.action == "retry" and step.delay_s >= 7.0
    assert (pacing.attempts, pacing.throttled) == (0, 1)


def test_throttling_that_outlasts_park_after_parks_the_request_instead_of_failing_it() -> None:
    time = FakeTime()
    pacing = _pacing(time)
    assert pacing.after(Outcome.THROTTLED, slow_down=True, timed_out=False, retry_after_s=None).action == "retry"
    time.now += PARK_AFTER_S - 1.0
    step = pacing.after(Outcome.THROTTLED, slow_down=True, timed_out=False, retry_after_s=5.0)
    assert step.action == "park" and step.delay_s >= PARK_AFTER_S / 4
    assert pacing.attempts == 0  # no attempt of the retry budget went on being told to wait


def test_any_other_answer_ends_a_run_of_throttling() -> None:
    time = FakeTime()
    pacing = _pacing(time)
    pacing.after(Outcome.THROTTLED, slow_down=True, timed_out=False, retry_after_s=None)
    pacing.after(Outcome.TRANSIENT, slow_down=False, timed_out=True, retry_after_s=None)
    assert (pacing.throttled, pacing.park_at, pacing.attempts) == (0, None, 1)
    time.now += PARK_AFTER_S * 2  # a later throttle starts its own run: it waits, it does not park at once
    assert pacing.after(Outcome.THROTTLED, slow_down=True, timed_out=False, retry_after_s=None).action == "retry"


def test_a_transient_failure_retries_until_the_attempts_are_spent() -> None:
    pacing = _pacing(FakeTime())
    steps = [pacing.after(Outcome.TRANSIENT, slow_down=False, timed_out=False, retry_after_s=None).action
             for _ in range(SPEC.retry.attempts)]
    assert steps == ["retry"] * (SPEC.retry.attempts - 1) + ["give_up"]


def test_an_answer_retrying_cannot_help_gives_up_at_once() -> None:
    pacing = _pacing(FakeTime())
    step = pacing.after(Outcome.PERMANENT, slow_down=False, timed_out=False, retry_after_s=None)
    assert (step.action, pacing.attempts) == ("give_up", 1)


def test_the_lanes_hear_every_answer_first_and_a_repeat_is_passed_on() -> None:
    lanes = Lanes(repeat=True)
    pacing = _pacing(FakeTime(), lanes, pooled=True)
    step = pacing.after(Outcome.THROTTLED, slow_down=True, timed_out=False, retry_after_s=3.0)
    assert lanes.heard == [(Outcome.THROTTLED, False, 3.0, True)]
    assert step.repeat


def test_a_slot_counts_the_attempt_it_lets_out() -> None:
    pacing = _pacing(FakeTime(), Lanes())
    assert pacing.slot() is None and pacing.slot() is None
    assert pacing.sent == 2


def test_a_lane_full_past_park_time_parks_before_anything_is_sent() -> None:
    pacing = _pacing(FakeTime(), Lanes(granted=False, wait_s=PARK_AFTER_S * 2))
    step = pacing.slot()
    assert step is not None and step.action == "park" and step.delay_s == PARK_AFTER_S * 2
    assert pacing.sent == 0
