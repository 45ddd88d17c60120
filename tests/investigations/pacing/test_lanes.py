"""Rate lanes on SQLite and Postgres: GCRA with burst, max-wait refusal, Retry-After floors and AIMD.

A fake clock and a sampler without jitter (sigma 0, no pauses, mean exactly the interval) make the
numbers exact.
"""

from __future__ import annotations

import random

import pytest

from investigations.events import Outcome
from investigations.pacing import GapSampler, LaneSpec, RateLanes, aimd, identity_lane, source_lane
from investigations.specs import SourceSpec, ThrottleSpec
from investigations.store import StateStore

T0 = 1_000.0
THROTTLE = ThrottleSpec(decrease_factor=0.5, increase_step=0.05, min_factor=0.05)
TEN = LaneSpec("source:ten", rate_per_s=10.0, burst=1)


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def lanes(store: StateStore, clock: FakeClock) -> RateLanes:
    exact = GapSampler(random.Random(0), sigma=0.0, pause_probability=0.0)
    return RateLanes(store, sampler=exact, clock=clock)


def waits(lanes: RateLanes, lane_list: list[LaneSpec], n: int, *, max_wait_s: float = 60.0) -> list[float]:
    out = []
    for _ in range(n):
        reservation = lanes.reserve(lane_list, max_wait_s=max_wait_s)
        assert reservation.granted
        out.append(reservation.wait_s)
    return out


def throttle(lanes: RateLanes, lane: LaneSpec, *, retry_after_s: float | None = None) -> None:
    lanes.feedback([lane], outcome=Outcome.THROTTLED, retry_after_s=retry_after_s, throttle=THROTTLE)


def succeed(lanes: RateLanes, lane: LaneSpec) -> None:
    lanes.feedback([lane], outcome=Outcome.OK, retry_after_s=None, throttle=THROTTLE)


def test_a_lane_row_is_created_on_first_use_at_the_full_rate(lanes: RateLanes) -> None:
    assert lanes.state(TEN.name) is None
    lanes.reserve([TEN], max_wait_s=1.0)
    state = lanes.state(TEN.name)
    assert state is not None
    assert (state.rate_factor, state.not_before_s, state.updated_at_s) == (1.0, 0.0, T0)
    assert state.tat_s == pytest.approx(T0 + 0.1)


def test_burst_admits_burst_requests_at_once_then_spaces_by_the_interval(lanes: RateLanes) -> None:
    lane = LaneSpec("source:bursty", rate_per_s=10.0, burst=3)
    assert waits(lanes, [lane], 5) == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2], abs=1e-9)


def test_an_idle_lane_saves_up_no_more_than_its_burst(lanes: RateLanes, clock: FakeClock) -> None:
    lane = LaneSpec("source:bursty", rate_per_s=10.0, burst=3)
    waits(lanes, [lane], 5)
    clock.now += 60.0
    assert waits(lanes, [lane], 4) == pytest.approx([0.0, 0.0, 0.0, 0.1], abs=1e-9)


def test_a_wait_beyond_max_wait_reserves_nothing(lanes: RateLanes) -> None:
    lane = LaneSpec("source:slow", rate_per_s=1.0, burst=1)
    lanes.reserve([lane], max_wait_s=0.0)
    before = lanes.state(lane.name)

    refused = lanes.reserve([lane], max_wait_s=0.5)

    assert not refused.granted
    assert refused.wait_s == pytest.approx(1.0)
    assert lanes.state(lane.name) == before
    assert lanes.reserve([lane], max_wait_s=5.0).wait_s == pytest.approx(1.0)  # the slot is still free


def test_a_request_on_two_lanes_waits_for_the_slower_one(lanes: RateLanes) -> None:
    fast, slow = LaneSpec("identity:s:a", 10.0, 1), LaneSpec("source:s", 2.0, 1)
    assert waits(lanes, [fast, slow], 2) == pytest.approx([0.0, 0.5])


def test_a_lane_held_back_by_another_counts_the_request_when_it_really_leaves(lanes: RateLanes) -> None:
    fast, slow = LaneSpec("identity:s:a", 10.0, 1), LaneSpec("source:s", 2.0, 1)
    waits(lanes, [fast, slow], 2)  # the second request leaves at T0 + 0.5
    # So the fast lane's next slot is 0.1 s after that send, not 0.1 s after its own slot at T0 + 0.1.
    assert lanes.reserve([fast], max_wait_s=5.0).wait_s == pytest.approx(0.6)


def test_retry_after_is_a_hard_floor_even_with_burst_left(lanes: RateLanes) -> None:
    lane = LaneSpec("source:bursty", rate_per_s=10.0, burst=5)
    lanes.reserve([lane], max_wait_s=1.0)
    throttle(lanes, lane, retry_after_s=30.0)
    assert lanes.reserve([lane], max_wait_s=60.0).wait_s == pytest.approx(30.0)


def test_a_shorter_retry_after_never_lifts_a_longer_floor(lanes: RateLanes) -> None:
    throttle(lanes, TEN, retry_after_s=30.0)
    throttle(lanes, TEN, retry_after_s=5.0)
    assert lanes.reserve([TEN], max_wait_s=60.0).wait_s == pytest.approx(30.0)


def test_a_throttle_signal_halves_the_rate_so_waits_grow_twice_as_fast(lanes: RateLanes) -> None:
    first = waits(lanes, [TEN], 2)
    throttle(lanes, TEN)
    later = waits(lanes, [TEN], 2)
    assert first == pytest.approx([0.0, 0.1])
    assert later == pytest.approx([0.2, 0.4])  # spaced 0.2 s: half of 10/s


def test_a_timeout_counts_as_a_throttle_signal(lanes: RateLanes) -> None:
    lanes.feedback([TEN], outcome=Outcome.TRANSIENT, timed_out=True, retry_after_s=None, throttle=THROTTLE)
    state = lanes.state(TEN.name)
    assert state is not None and state.rate_factor == pytest.approx(0.5)


def test_successes_restore_the_rate_stepwise_up_to_the_configured_one(lanes: RateLanes) -> None:
    throttle(lanes, TEN)
    expected, seen = [], []
    factor = aimd.decrease(1.0, THROTTLE)
    for _ in range(12):
        succeed(lanes, TEN)
        factor = aimd.increase(factor, THROTTLE)
        expected.append(factor)
        state = lanes.state(TEN.name)
        assert state is not None
        seen.append(state.rate_factor)
    assert seen == pytest.approx(expected)
    assert seen[9:] == pytest.approx([1.0, 1.0, 1.0])  # ten steps of 0.05 from 0.5, then capped


def test_repeated_throttling_never_takes_the_rate_below_min_factor(lanes: RateLanes) -> None:
    for _ in range(20):
        throttle(lanes, TEN)
    state = lanes.state(TEN.name)
    assert state is not None and state.rate_factor == pytest.approx(THROTTLE.min_factor)


def test_an_outcome_that_says_nothing_about_rate_leaves_the_lane_alone(lanes: RateLanes) -> None:
    lanes.reserve([TEN], max_wait_s=1.0)
    before = lanes.state(TEN.name)
    lanes.feedback([TEN], outcome=Outcome.BLOCKED, retry_after_s=None, throttle=THROTTLE)
    assert lanes.state(TEN.name) == before


def test_all_states_lists_every_lane_by_name(lanes: RateLanes) -> None:
    lanes.reserve([LaneSpec("source:b", 1.0, 1), LaneSpec("identity:b:x", 1.0, 1)], max_wait_s=1.0)
    assert [state.lane for state in lanes.all_states()] == ["identity:b:x", "source:b"]


def test_source_and_identity_lanes_take_their_names_and_limits_from_the_spec() -> None:
    spec = SourceSpec.model_validate({
        "name": "demo", "adapter": "json_api", "lead_kinds": ["domain"],
        "request": {"url": "https://example.test/{value}"},
        "rate": {"source_per_s": 4.0, "source_burst": 3, "identity_per_s": 0.5, "identity_burst": 2},
    })
    assert source_lane(spec) == LaneSpec("source:demo", 4.0, 3)
    assert identity_lane(spec, "proxy-7") == LaneSpec("identity:demo:proxy-7", 0.5, 2)
