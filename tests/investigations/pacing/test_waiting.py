"""How one request waits for its lanes: a request that wakes too late for its slot books another
instead of sending into a burst the lanes never booked; an on-time one sends on its slot."""

from __future__ import annotations

from pathlib import Path

import pytest

from investigations.pacing.lanes import Reservation, identity_lane, source_lane
from investigations.pacing.waiting import MAX_REBOOKS, LaneFull, LaneWaiter
from investigations.sources.specs import load_sources
from tests.fakes import FakeTime

ROOT = Path(__file__).resolve().parents[3]
SPEC = load_sources(ROOT / "sources.yaml").get("robust")  # 10/s at the source: one interval is 0.1 s


class Lanes:
    """Stands in for RateLanes: every reservation is granted, its slot `wait_s` ahead."""

    def __init__(self, wait_s: float = 0.5, granted: bool = True) -> None:
        self.wait_s, self.granted, self.reserved = wait_s, granted, 0
        self.horizons: list[float | None] = []

    def reserve(self, lanes, *, max_wait_s: float, max_ahead_intervals: float | None = None) -> Reservation:
        self.reserved += 1
        self.horizons.append(max_ahead_intervals)
        return Reservation(granted=self.granted, wait_s=self.wait_s)

    def think_s(self, period_s: float) -> float:
        return 0.0


def _lanes() -> list:
    return [source_lane(SPEC), identity_lane(SPEC, "direct")]


def _stalling(time: FakeTime, stalls: list[float]) -> None:
    """A sleep that overruns by the next of `stalls` (a process stalled while the request slept)."""

    def on_sleep(slept: list[float]) -> None:
        if stalls:
            time.now += stalls.pop(0)

    time.on_sleep = on_sleep


def test_a_request_on_time_sends_on_its_one_slot() -> None:
    time, lanes = FakeTime(), Lanes()
    waiter = LaneWaiter(lanes, sleep=time.sleep, clock=time.clock)  # type: ignore[arg-type]
    waiter.wait(SPEC, _lanes(), None)
    assert (lanes.reserved, waiter.rebooked, time.now) == (1, 0, 0.5)


def test_a_request_woken_more_than_an_interval_late_books_a_new_slot() -> None:
    time, lanes = FakeTime(), Lanes()
    _stalling(time, [1.0])  # the first sleep ends 1 s late: ten of robust's intervals
    waiter = LaneWaiter(lanes, sleep=time.sleep, clock=time.clock)  # type: ignore[arg-type]
    waiter.wait(SPEC, _lanes(), None)
    assert (lanes.reserved, waiter.rebooked) == (2, 1)


def test_a_little_lateness_is_not_worth_a_slot() -> None:
    time, lanes = FakeTime(), Lanes()
    _stalling(time, [0.05])  # half an interval late
    waiter = LaneWaiter(lanes, sleep=time.sleep, clock=time.clock)  # type: ignore[arg-type]
    waiter.wait(SPEC, _lanes(), None)
    assert (lanes.reserved, waiter.rebooked) == (1, 0)


def test_a_process_that_is_always_late_still_sends_after_its_last_rebook() -> None:
    time, lanes = FakeTime(), Lanes()
    _stalling(time, [1.0] * 10)
    waiter = LaneWaiter(lanes, sleep=time.sleep, clock=time.clock)  # type: ignore[arg-type]
    waiter.wait(SPEC, _lanes(), None)
    assert (lanes.reserved, waiter.rebooked) == (MAX_REBOOKS + 1, MAX_REBOOKS)


def test_lanes_that_stay_full_past_the_parking_time_raise_lane_full() -> None:
    time, lanes = FakeTime(), Lanes(wait_s=SPEC.throttle.park_after_s + 1, granted=False)
    waiter = LaneWaiter(lanes, sleep=time.sleep, clock=time.clock)  # type: ignore[arg-type]
    with pytest.raises(LaneFull):
        waiter.wait(SPEC, _lanes(), None)


@pytest.mark.parametrize(("rate", "intervals"), [(30.0, 4.5), (10.0, 1.5), (2.0, 1.0)])
def test_background_work_books_an_interval_ahead_or_a_fixed_time_on_a_fast_source(rate: float, intervals: float
                                                                                   ) -> None:
    # On a fast source one interval is too close for a batch's threads to keep the next slot taken.
    spec = SPEC.model_copy(update={"rate": SPEC.rate.model_copy(update={"source_per_s": rate})})
    time, lanes = FakeTime(), Lanes()
    waiter = LaneWaiter(lanes, sleep=time.sleep, clock=time.clock)  # type: ignore[arg-type]
    waiter.wait(spec, _lanes(), None, background=True)
    waiter.wait(spec, _lanes(), None)  # a fresh lead's request books without a horizon
    assert lanes.horizons == [pytest.approx(intervals), None]
