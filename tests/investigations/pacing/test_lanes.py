"""Rate lanes on SQLite and Postgres: GCRA with burst, max-wait refusal, Retry-After floors and AIMD
with a remembered ceiling, held to the reference rules in `aimd`.

A fake clock and a sampler without jitter (sigma 0, no pauses, mean exactly the interval) make the
numbers exact.
"""

from __future__ import annotations

import random
import statistics
from itertools import pairwise

import pytest
from sqlalchemy import event

from investigations.collection.events import Outcome
from investigations.pacing import GapSampler, RateLanes, aimd
from investigations.pacing.jitter import RHYTHM_GAPS, RHYTHM_MIN_CV, RHYTHM_SENDS_KEPT
from investigations.pacing.lanes import LaneSpec, effective_burst, identity_lane, source_lane
from investigations.sources.specs import SourceSpec, ThrottleSpec
from investigations.store import StateStore
from tests.fakes import FakeClock, runs_without_the_write_lock

T0 = 1_000.0
THROTTLE = ThrottleSpec(decrease_factor=0.5, increase_step=0.05, min_factor=0.05, cut_hold_s=2.0,
                        ceiling_margin=0.1, ceiling_hold_s=60.0, probe_step=0.01)
TEN = LaneSpec("source:ten", rate_per_s=10.0, burst=1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


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
    assert state.aimd_state == aimd.AimdState()  # no ceiling known, never cut


@pytest.mark.parametrize("outcome", [Outcome.THROTTLED, Outcome.OK])
def test_feedback_before_any_reservation_creates_the_row_the_reference_rules_give(
    lanes: RateLanes, outcome: Outcome
) -> None:
    lanes.feedback([TEN], outcome=outcome, retry_after_s=None, throttle=THROTTLE)
    rule = aimd.on_throttle if outcome is Outcome.THROTTLED else aimd.on_success
    state = lanes.state(TEN.name)
    assert state is not None and state.aimd_state == rule(aimd.AimdState(), T0, THROTTLE)


def test_burst_admits_burst_requests_at_once_then_spaces_by_the_interval(lanes: RateLanes) -> None:
    lane = LaneSpec("source:bursty", rate_per_s=10.0, burst=3)
    assert waits(lanes, [lane], 5) == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2], abs=1e-9)


def test_an_idle_lane_saves_up_no_more_than_its_burst(lanes: RateLanes, clock: FakeClock) -> None:
    lane = LaneSpec("source:bursty", rate_per_s=10.0, burst=3)
    waits(lanes, [lane], 5)
    clock.now += 60.0
    assert waits(lanes, [lane], 4) == pytest.approx([0.0, 0.0, 0.0, 0.1], abs=1e-9)


def test_a_cut_lane_saves_up_a_burst_scaled_like_its_rate(lanes: RateLanes, clock: FakeClock) -> None:
    """A lane cut to half its rate after a lull sends half its burst back to back, not all of it:
    the allowance lasts as long as configured (0.3 s here), not twice as long."""
    lane = LaneSpec("source:bursty", rate_per_s=10.0, burst=6)
    throttle(lanes, lane)  # factor 0.5: 5/s, a burst of 3
    clock.now += 60.0
    assert waits(lanes, [lane], 5) == pytest.approx([0.0, 0.0, 0.0, 0.2, 0.4], abs=1e-9)


@pytest.mark.parametrize(("burst", "factor", "allowed"), [
    (6, 1.0, 6.0),  # never cut: the burst as configured
    (6, 0.5, 3.0),
    (20, 0.25, 5.0),  # a burst 4x too large, the rate cut to a quarter: nginx's own burst again
    (2, 0.25, 1.0),  # never below one request
])
def test_the_effective_burst_scales_with_the_factor(burst: int, factor: float, allowed: float) -> None:
    assert effective_burst(burst, factor) == pytest.approx(allowed)


def test_a_slot_is_dated_from_when_the_lane_was_locked_not_from_before_waiting_for_the_lock(
    lanes: RateLanes, store: StateStore, clock: FakeClock
) -> None:
    """A request that waited for another's lock (here 0.5 s, as the clock moves while the
    transaction begins) gets a slot from the moment it holds the lane: dated from before the wait,
    every such request's slot would lie in the past and they would all go at once when it frees."""
    waits(lanes, [TEN], 1)
    clock.now += 10.0  # the lane idles: its next slot is "now", whenever now is

    def lock_wait(conn) -> None:
        clock.now += 0.5

    event.listen(store.engine, "begin", lock_wait)
    try:
        reservation = lanes.reserve([TEN], max_wait_s=1.0)
    finally:
        event.remove(store.engine, "begin", lock_wait)
    state = lanes.state(TEN.name)
    assert reservation.granted and reservation.wait_s == pytest.approx(0.0)
    assert state is not None and state.tat_s == pytest.approx(T0 + 10.0 + 0.5 + 0.1)


def test_a_wait_beyond_max_wait_reserves_nothing(lanes: RateLanes) -> None:
    lane = LaneSpec("source:slow", rate_per_s=1.0, burst=1)
    lanes.reserve([lane], max_wait_s=0.0)
    before = lanes.state(lane.name)

    refused = lanes.reserve([lane], max_wait_s=0.5)

    assert not refused.granted
    assert refused.wait_s == pytest.approx(1.0)
    assert lanes.state(lane.name) == before
    assert lanes.reserve([lane], max_wait_s=5.0).wait_s == pytest.approx(1.0)  # the slot is still free


def test_background_books_no_slot_beyond_its_horizon_and_is_told_when_to_ask_again(lanes: RateLanes) -> None:
    lane = LaneSpec("source:slow", rate_per_s=1.0, burst=1)
    assert lanes.reserve([lane], max_wait_s=60.0, max_ahead_intervals=1.0).wait_s == 0.0
    assert lanes.reserve([lane], max_wait_s=60.0, max_ahead_intervals=1.0).wait_s == pytest.approx(1.0)  # at the horizon
    before = lanes.state(lane.name)

    refused = lanes.reserve([lane], max_wait_s=60.0, max_ahead_intervals=1.0)  # its slot is 2 intervals ahead

    assert not refused.granted and lanes.state(lane.name) == before
    assert 1.0 <= refused.yield_s <= 2.0  # when the slot comes within the horizon, plus up to an interval
    assert refused.held_by == lane.name and refused.held_intervals == pytest.approx(2.0)


def test_a_fresh_lead_s_request_takes_the_slot_background_work_left_free(lanes: RateLanes) -> None:
    lane = LaneSpec("source:slow", rate_per_s=1.0, burst=1)
    for _ in range(5):  # five batch threads ask; two book, three stand back
        lanes.reserve([lane], max_wait_s=60.0, max_ahead_intervals=1.0)
    assert lanes.reserve([lane], max_wait_s=60.0).wait_s == pytest.approx(2.0)  # not 5 s behind them


def test_a_request_on_two_lanes_waits_for_the_slower_one(lanes: RateLanes) -> None:
    fast, slow = LaneSpec("identity:s:a", 10.0, 1), LaneSpec("source:s", 2.0, 1)
    assert waits(lanes, [fast, slow], 2) == pytest.approx([0.0, 0.5])


def test_a_reservation_names_the_lane_it_waited_for_and_how_many_of_its_intervals(lanes: RateLanes) -> None:
    fast, slow = LaneSpec("identity:s:a", 10.0, 1), LaneSpec("source:s", 2.0, 1)
    first = lanes.reserve([fast, slow], max_wait_s=60)
    assert first.held_by is None and first.held_intervals == 0.0  # went at once
    lanes.reserve([slow], max_wait_s=60)  # another identity takes the source's next slot
    third = lanes.reserve([fast, slow], max_wait_s=60)
    assert third.held_by == "source:s"
    assert third.held_intervals == pytest.approx(2.0)  # one slot of its own turn, one taken by the other


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


def test_a_throttle_within_the_cut_hold_still_sets_its_retry_after_floor(lanes: RateLanes, clock: FakeClock) -> None:
    throttle(lanes, TEN)
    clock.now += 1.0
    throttle(lanes, TEN, retry_after_s=30.0)
    state = lanes.state(TEN.name)
    assert state is not None and state.rate_factor == pytest.approx(0.5)  # not cut a second time
    assert lanes.reserve([TEN], max_wait_s=60.0).wait_s == pytest.approx(30.0)


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


def factors_after_successes(lanes: RateLanes, clock: FakeClock, n: int, *, every_s: float = 1.0) -> list[float]:
    seen = []
    for _ in range(n):
        clock.now += every_s
        succeed(lanes, TEN)
        state = lanes.state(TEN.name)
        assert state is not None
        seen.append(state.rate_factor)
    return seen


def test_a_burst_of_throttles_from_requests_in_flight_cuts_the_rate_once(lanes: RateLanes, clock: FakeClock) -> None:
    for _ in range(6):
        throttle(lanes, TEN)
        clock.now += 0.3
    state = lanes.state(TEN.name)
    assert state is not None
    assert (state.rate_factor, state.ceiling_factor, state.last_cut_s) == pytest.approx((0.5, 1.0, T0))


def test_throttles_further_apart_than_the_cut_hold_cut_again_and_lower_the_ceiling(
    lanes: RateLanes, clock: FakeClock
) -> None:
    throttle(lanes, TEN)
    clock.now += THROTTLE.cut_hold_s
    throttle(lanes, TEN)
    state = lanes.state(TEN.name)
    assert state is not None
    assert (state.rate_factor, state.ceiling_factor, state.last_cut_s) == pytest.approx((0.25, 0.5, clock.now))


def test_successes_climb_back_fast_to_just_under_the_ceiling(lanes: RateLanes, clock: FakeClock) -> None:
    throttle(lanes, TEN)  # ceiling 1.0, factor 0.5
    seen = factors_after_successes(lanes, clock, 10)
    # Eight steps of 0.05 from 0.5 reach the target, 10 % under the ceiling, and stay there.
    assert seen == pytest.approx([0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.9, 0.9])


def test_the_factor_holds_under_the_ceiling_until_ceiling_hold_then_probes_up_to_the_configured_rate(
    lanes: RateLanes, clock: FakeClock
) -> None:
    throttle(lanes, TEN)
    factors_after_successes(lanes, clock, 8)  # at the target, 0.9
    clock.now = T0 + THROTTLE.ceiling_hold_s - 1.0
    assert factors_after_successes(lanes, clock, 1, every_s=0.0) == pytest.approx([0.9])
    clock.now = T0 + THROTTLE.ceiling_hold_s
    # At its 10 r/s a success a tenth of a second: probe_step (0.01) of the configured rate a second.
    seen = factors_after_successes(lanes, clock, 120, every_s=0.1)
    assert seen[:3] == pytest.approx([0.901, 0.902, 0.903])
    assert seen[9] == pytest.approx(0.91)  # one second of probing
    assert seen[99:] == pytest.approx([1.0] * 21)  # ten seconds, then the configured rate


def test_a_faster_lane_probes_by_the_same_share_of_itself_a_second(lanes: RateLanes, clock: FakeClock) -> None:
    """Probing grows a lane's rate by probe_step of itself a second, whatever its configured rate:
    by a step per success, a lane of 50 r/s would probe five times as fast as one of 10."""
    fast = LaneSpec("source:fifty", rate_per_s=50.0, burst=1)
    for lane in (TEN, fast):
        lanes.feedback([lane], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=THROTTLE)
        for _ in range(8):  # back to the target, 0.9, where it holds
            lanes.feedback([lane], outcome=Outcome.OK, retry_after_s=None, throttle=THROTTLE)
    clock.now += THROTTLE.ceiling_hold_s
    for lane, every_s in ((TEN, 0.1), (fast, 0.02)):  # each at its rate, for one second
        for _ in range(round(1.0 / every_s)):
            clock.now += every_s
            lanes.feedback([lane], outcome=Outcome.OK, retry_after_s=None, throttle=THROTTLE)
    assert factors(lanes, TEN, fast) == pytest.approx([0.91, 0.91])


def test_repeated_throttling_never_takes_the_rate_below_min_factor(lanes: RateLanes, clock: FakeClock) -> None:
    for _ in range(20):
        throttle(lanes, TEN)
        clock.now += THROTTLE.cut_hold_s
    state = lanes.state(TEN.name)
    assert state is not None and state.rate_factor == pytest.approx(THROTTLE.min_factor)


def test_the_lane_statement_agrees_with_the_reference_rules_step_by_step(lanes: RateLanes, clock: FakeClock) -> None:
    # Two lanes per feedback, as a request on a source and an identity lane gives it; every throttle
    # cuts both (corroborate_s 0), so both follow the reference.
    other = LaneSpec("identity:ten:a", rate_per_s=2.0, burst=1)
    both = THROTTLE.model_copy(update={"corroborate_s": 0.0})
    rng = random.Random(3)
    expected = {lane.name: aimd.AimdState() for lane in (TEN, other)}
    for _ in range(300):
        clock.now += rng.expovariate(1.0) * rng.choice([0.2, 2.0, 40.0])
        throttled = rng.random() < 0.25
        lanes.feedback([TEN, other], outcome=Outcome.THROTTLED if throttled else Outcome.OK, retry_after_s=None,
                       throttle=both)
        for lane in (TEN, other):
            before = expected[lane.name]
            expected[lane.name] = (aimd.on_throttle(before, clock.now, both) if throttled else
                                   aimd.on_success(before, clock.now, both, rate_per_s=lane.rate_per_s))
            state = lanes.state(lane.name)
            assert state is not None
            assert state.aimd_state == expected[lane.name]


def test_an_outcome_that_says_nothing_about_rate_leaves_the_lane_alone(lanes: RateLanes) -> None:
    lanes.reserve([TEN], max_wait_s=1.0)
    before = lanes.state(TEN.name)
    lanes.feedback([TEN], outcome=Outcome.BLOCKED, retry_after_s=None, throttle=THROTTLE)
    assert lanes.state(TEN.name) == before


def test_all_states_lists_every_lane_by_name(lanes: RateLanes) -> None:
    lanes.reserve([LaneSpec("source:b", 1.0, 1), LaneSpec("identity:b:x", 1.0, 1)], max_wait_s=1.0)
    assert [state.lane for state in lanes.all_states()] == ["identity:b:x", "source:b"]


def test_all_states_shows_each_lane_s_remembered_ceiling(lanes: RateLanes, clock: FakeClock) -> None:
    lanes.reserve([LaneSpec("source:b", 1.0, 1)], max_wait_s=1.0)
    throttle(lanes, TEN)
    clock.now += THROTTLE.cut_hold_s
    throttle(lanes, TEN)
    ceilings = {state.lane: (state.ceiling_factor, state.last_cut_s) for state in lanes.all_states()}
    assert ceilings == {"source:b": (1.0, 0.0), TEN.name: (pytest.approx(0.5), clock.now)}


def test_source_and_identity_lanes_take_their_names_and_limits_from_the_spec() -> None:
    spec = SourceSpec.model_validate({
        "name": "demo", "adapter": "json_api", "lead_kinds": ["domain"],
        "request": {"url": "https://example.test/{value}"},
        "rate": {"source_per_s": 4.0, "source_burst": 3, "identity_per_s": 0.5, "identity_burst": 2},
    })
    assert source_lane(spec) == LaneSpec("source:demo", 4.0, 3)
    assert identity_lane(spec, "proxy-7") == LaneSpec("identity:demo:proxy-7", 0.5, 2, guard_rhythm=True)


# -- rhythm guard ----------------------------------------------------------------------------------

GUARDED = LaneSpec("identity:s:a", rate_per_s=1.0, burst=1, guard_rhythm=True)
UNGUARDED = LaneSpec("identity:s:a", rate_per_s=1.0, burst=1)


def near_regular(seed: int) -> GapSampler:
    """Send delays all but fixed and no pauses: the sends follow the slots, whose slack varies little."""
    return GapSampler(random.Random(seed), sigma=0.001, pause_probability=0.0)


def planned_sends(lanes: list[RateLanes], lane: LaneSpec, clock: FakeClock, n: int) -> list[float]:
    """`n` sends of one lane taking turns between `lanes`, each asked for as the previous one leaves;
    a reservation the guard refuses is asked for again when its floor opens, as the fetcher does."""
    sends = []
    for i in range(n):
        while not (reservation := lanes[i % len(lanes)].reserve([lane], max_wait_s=60.0)).granted:
            assert reservation.rhythm_extra_s > 0
            clock.now += reservation.wait_s
        clock.now += reservation.wait_s
        sends.append(clock.now)
    return sends


def lowest_window_cv(sends: list[float]) -> float:
    gaps = [b - a for a, b in pairwise(sends)]
    windows = [gaps[i:i + RHYTHM_GAPS] for i in range(len(gaps) - RHYTHM_GAPS + 1)]
    return min(statistics.pstdev(window) / statistics.fmean(window) for window in windows)


def test_without_the_guard_a_near_regular_sampler_s_sends_fall_below_the_floor(
    store: StateStore, clock: FakeClock
) -> None:
    sends = planned_sends([RateLanes(store, sampler=near_regular(30), clock=clock)], UNGUARDED, clock, 60)
    assert lowest_window_cv(sends) < RHYTHM_MIN_CV / 2


def test_the_guard_keeps_every_window_of_a_near_regular_sampler_s_sends_above_the_floor(
    store: StateStore, clock: FakeClock
) -> None:
    sends = planned_sends([RateLanes(store, sampler=near_regular(30), clock=clock)], GUARDED, clock, 60)
    assert lowest_window_cv(sends) >= RHYTHM_MIN_CV - 1e-9


def test_a_success_of_lanes_at_their_full_rate_writes_nothing(sqlite_store: StateStore, clock: FakeClock) -> None:
    """Most answers are successes of lanes never cut, which change nothing (aimd.on_success at factor
    1): they are read, not written, so they do not wait for SQLite's one writer."""
    lanes = RateLanes(sqlite_store, sampler=GapSampler(random.Random(0), sigma=0.0, pause_probability=0.0),
                      clock=clock)
    lanes.reserve([TEN], max_wait_s=1.0)
    assert runs_without_the_write_lock(sqlite_store, lambda: succeed(lanes, TEN))
    throttle(lanes, TEN)  # now at half its rate: a success has something to win back, and is written
    assert not runs_without_the_write_lock(sqlite_store, lambda: succeed(lanes, TEN), wait_s=1.0)
    state = lanes.state(TEN.name)
    assert state is not None and state.rate_factor == pytest.approx(0.55)


def test_a_new_run_and_a_restarted_fleet_start_at_the_rates_the_fleet_learned(
    database: tuple[str, str | None], clock: FakeClock
) -> None:
    """What one run's requests taught the lanes (a cut, the ceiling it remembers and when) lives in
    the state store, not in the run: a run that starts later, in another process, or the whole
    fleet started again, paces from it, neither from the configured rate nor from a guess."""
    url, schema = database
    identity = LaneSpec("identity:ten:a", rate_per_s=4.0, burst=1)
    first = StateStore.from_url(url, schema=schema)
    exact = GapSampler(random.Random(0), sigma=0.0, pause_probability=0.0)
    RateLanes(first, sampler=exact, clock=clock).feedback([TEN, identity], outcome=Outcome.THROTTLED,
                                                           retry_after_s=None, throttle=THROTTLE)
    first.close()  # the run ends; later the fleet stops and starts again
    clock.now += 600.0
    later = StateStore.from_url(url, schema=schema)
    try:
        lanes = RateLanes(later, sampler=exact, clock=clock)
        for lane in (TEN, identity):
            state = lanes.state(lane.name)
            assert state is not None
            assert (state.rate_factor, state.ceiling_factor, state.last_cut_s) == pytest.approx((0.5, 1.0, T0))
        # Sent at the learned half rates: 5/s on the source's lane, 2/s on the identity's.
        assert waits(lanes, [TEN], 3) == pytest.approx([0.0, 0.2, 0.4], abs=1e-9)
        assert waits(lanes, [identity], 2) == pytest.approx([0.0, 0.5], abs=1e-9)
    finally:
        later.close()


def test_the_guard_sees_what_other_processes_sent_on_the_lane(store: StateStore, clock: FakeClock) -> None:
    two = [RateLanes(store, sampler=near_regular(31), clock=clock), RateLanes(store, sampler=near_regular(32), clock=clock)]
    sends = planned_sends(two, GUARDED, clock, 60)
    assert lowest_window_cv(sends) >= RHYTHM_MIN_CV - 1e-9


def test_a_guarded_lane_remembers_its_last_planned_sends_and_an_unguarded_one_none(
    store: StateStore, clock: FakeClock
) -> None:
    lanes = RateLanes(store, sampler=near_regular(33), clock=clock)
    source = LaneSpec("source:s", rate_per_s=2.0, burst=1)
    sends = []
    for _ in range(RHYTHM_SENDS_KEPT + 3):
        while not (reservation := lanes.reserve([source, GUARDED], max_wait_s=60.0)).granted:
            clock.now += reservation.wait_s
        clock.now += reservation.wait_s
        sends.append(clock.now)
    guarded, unguarded = lanes.state(GUARDED.name), lanes.state(source.name)
    assert guarded is not None and unguarded is not None
    assert guarded.recent_sends_s == pytest.approx(sends[-RHYTHM_SENDS_KEPT:], abs=1e-9)
    assert unguarded.recent_sends_s == ()


def test_a_refused_reservation_leaves_the_remembered_sends_as_they_were(store: StateStore, clock: FakeClock) -> None:
    lanes = RateLanes(store, sampler=near_regular(34), clock=clock)
    planned_sends([lanes], GUARDED, clock, RHYTHM_GAPS)
    before = lanes.state(GUARDED.name)
    assert before is not None and len(before.recent_sends_s) == RHYTHM_GAPS

    assert not lanes.reserve([GUARDED], max_wait_s=0.0).granted  # its slot is still ahead

    after = lanes.state(GUARDED.name)
    assert after is not None and (after.recent_sends_s, after.tat_s) == (before.recent_sends_s, before.tat_s)


def guard_fires(lanes: RateLanes, lane_list: list[LaneSpec], clock: FakeClock):
    """Send on `lane_list` until the guard refuses a reservation; return it and the lanes' states before it."""
    for _ in range(60):
        before = {lane.name: lanes.state(lane.name) for lane in lane_list}
        reservation = lanes.reserve(lane_list, max_wait_s=60.0)
        if not reservation.granted:
            assert reservation.rhythm_extra_s > 0
            return reservation, before
        clock.now += reservation.wait_s
    pytest.fail("the guard never fired")


def test_a_send_the_guard_refuses_reserves_nothing_and_keeps_the_shared_lane_s_slot_free(
    store: StateStore, clock: FakeClock
) -> None:
    lanes = RateLanes(store, sampler=near_regular(35), clock=clock)
    source = LaneSpec("source:s", rate_per_s=50.0, burst=1)
    refused, before = guard_fires(lanes, [source, GUARDED], clock)
    source_state = lanes.state(source.name)
    assert source_state is not None and source_state.tat_s == before[source.name].tat_s
    # Another identity on the source goes at once instead of waiting behind the held one.
    other = LaneSpec("identity:s:b", rate_per_s=1.0, burst=1, guard_rhythm=True)
    granted = lanes.reserve([source, other], max_wait_s=60.0)
    assert granted.wait_s - granted.delay_s <= 1.0 / source.rate_per_s + 1e-9  # its slot, before its own jitter
    assert refused.wait_s > 0


def test_a_refused_send_floors_the_identity_s_lane_until_its_rhythm_breaks(store: StateStore, clock: FakeClock) -> None:
    lanes = RateLanes(store, sampler=near_regular(36), clock=clock)
    refused, before = guard_fires(lanes, [GUARDED], clock)
    resume_at = clock.now + refused.wait_s
    state = lanes.state(GUARDED.name)
    assert state is not None and state.not_before_s == pytest.approx(resume_at)
    assert state.recent_sends_s == before[GUARDED.name].recent_sends_s  # nothing was sent
    early = lanes.reserve([GUARDED], max_wait_s=60.0)  # asking again before the floor is no use
    assert not early.granted or clock.now + early.wait_s >= resume_at - 1e-9
    clock.now = resume_at
    assert lanes.reserve([GUARDED], max_wait_s=60.0).granted


def _slot(lane: LaneSpec, send_at_s: float):  # noqa: ANN202 - a lane's slot as reserve() sees it
    from investigations.pacing.lanes import _Slot

    interval = 1.0 / lane.rate_per_s
    return _Slot(lane=lane, start_s=send_at_s, gap_s=interval, interval_s=interval, send_at_s=send_at_s,
                 recent_sends_s=())


def test_a_send_delay_is_drawn_at_the_fastest_lane_s_scale_whichever_lane_held_the_request() -> None:
    from investigations.pacing.lanes import delay_scale_s

    own, shared = LaneSpec("identity:s:a", 2.0, 1), LaneSpec("source:s", 10.0, 1)
    assert delay_scale_s([_slot(own, T0 + 0.3), _slot(shared, T0 + 0.1)]) == pytest.approx(0.1)
    assert delay_scale_s([_slot(own, T0), _slot(shared, T0)]) == pytest.approx(0.1)


# -- which lanes a throttle cuts ----------------------------------------------------------------

SITE = LaneSpec("source:site", rate_per_s=8.0, burst=2)
ALICE = LaneSpec("identity:site:alice", rate_per_s=3.0, burst=2, guard_rhythm=True)
BOB = LaneSpec("identity:site:bob", rate_per_s=3.0, burst=2, guard_rhythm=True)
ELSEWHERE = LaneSpec("identity:other:carol", rate_per_s=3.0, burst=2, guard_rhythm=True)


def factors(lanes: RateLanes, *lane_list: LaneSpec) -> list[float | None]:
    return [state.rate_factor if (state := lanes.state(lane.name)) else None for lane in lane_list]


def throttle_as(lanes: RateLanes, identity: LaneSpec, *, retry_after_s: float | None = None) -> bool:
    return lanes.feedback([SITE, identity], outcome=Outcome.THROTTLED, retry_after_s=retry_after_s,
                          throttle=THROTTLE, pooled_identity=True)


def test_one_identity_throttled_cuts_its_own_lane_and_leaves_the_source_lane_alone(lanes: RateLanes) -> None:
    waits(lanes, [SITE, ALICE], 1)
    throttle_as(lanes, ALICE)
    assert factors(lanes, SITE, ALICE) == pytest.approx([1.0, 0.5])


def test_a_second_identity_throttled_within_corroborate_s_cuts_the_source_lane_too(
    lanes: RateLanes, clock: FakeClock
) -> None:
    throttle_as(lanes, ALICE)
    clock.now += THROTTLE.corroborate_s - 1.0
    throttle_as(lanes, BOB)
    assert factors(lanes, SITE, ALICE, BOB) == pytest.approx([0.5, 0.5, 0.5])


def test_identities_throttled_further_apart_than_corroborate_s_never_cut_the_source_lane(
    lanes: RateLanes, clock: FakeClock
) -> None:
    throttle_as(lanes, ALICE)
    clock.now += THROTTLE.corroborate_s
    throttle_as(lanes, BOB)
    clock.now += THROTTLE.corroborate_s
    throttle_as(lanes, ALICE)  # the same identity again: a limit on that address, not on the site
    assert factors(lanes, SITE, ALICE, BOB) == pytest.approx([None, 0.25, 0.5])


def test_in_a_larger_pool_the_source_lane_is_cut_by_three_identities_throttled_within_corroborate_s(
    lanes: RateLanes, clock: FakeClock
) -> None:
    """Four identities that have sent: two refused within seconds may be two addresses' own limits;
    a third within the window is the site refusing whoever asks."""
    carol, dave = (LaneSpec(f"identity:site:{name}", rate_per_s=3.0, burst=2, guard_rhythm=True)
                   for name in ("carol", "dave"))
    for identity in (ALICE, BOB, carol, dave):
        waits(lanes, [SITE, identity], 1)
    throttle_as(lanes, ALICE)
    clock.now += 1.0
    throttle_as(lanes, BOB)
    assert factors(lanes, SITE) == pytest.approx([1.0])
    clock.now += 1.0
    throttle_as(lanes, carol)
    # Each identity's cut stops at its share of the site lane as it was (8 r/s over four identities
    # of 3 r/s: 2/3), not at the plain halving.
    assert factors(lanes, SITE, ALICE, BOB, carol, dave) == pytest.approx([0.5, 2 / 3, 2 / 3, 2 / 3, 1.0])


def _pool_of_four(lanes: RateLanes) -> list[LaneSpec]:
    pool = [ALICE, BOB] + [LaneSpec(f"identity:site:{name}", rate_per_s=3.0, burst=2, guard_rhythm=True)
                           for name in ("carol", "dave")]
    _keep_sending(lanes, pool)
    return pool


def _keep_sending(lanes: RateLanes, pool: list[LaneSpec]) -> None:
    """Each identity of the pool sends a request now: all of them share the site lane."""
    for identity in pool:
        waits(lanes, [SITE, identity], 1)


def test_an_identity_refused_at_its_share_of_the_site_lane_is_neither_slowed_nor_given_a_lower_ceiling(
    lanes: RateLanes, clock: FakeClock
) -> None:
    """A site-wide limit refuses whoever asks next: an identity sending no more than its share of
    what the site lane lets through is not the one sending too fast."""
    pool = _pool_of_four(lanes)
    throttle_as(lanes, ALICE)  # 1.0 -> its share, 2/3 (8 r/s over four identities of 3 r/s)
    clock.now += 100.0  # long past the cut's hold and the corroboration window
    _keep_sending(lanes, pool)
    throttle_as(lanes, ALICE)  # refused again at its share
    state = lanes.state(ALICE.name)
    assert state is not None
    assert state.rate_factor == pytest.approx(2 / 3)
    assert state.ceiling_factor == pytest.approx(1.0)  # the first cut's; not lowered by the second
    assert state.last_cut_s == clock.now  # the refusal is marked, for the other identities' to corroborate


def test_refusals_of_identities_at_their_share_still_cut_the_site_lane_together(lanes: RateLanes,
                                                                                clock: FakeClock) -> None:
    pool = _pool_of_four(lanes)
    for identity in pool[:3]:  # refused far apart: each its own limit, cut to its share
        throttle_as(lanes, identity)
        clock.now += THROTTLE.corroborate_s + 1.0
    assert factors(lanes, SITE, *pool[:3]) == pytest.approx([1.0] + [2 / 3] * 3)
    clock.now += 100.0
    _keep_sending(lanes, pool)
    for identity in pool[:3]:  # at their shares now: not slowed, but three within seconds is the site
        throttle_as(lanes, identity)
        clock.now += 0.5
    assert factors(lanes, SITE) == pytest.approx([0.5])
    assert factors(lanes, *pool[:3]) == pytest.approx([2 / 3] * 3)


def test_an_identity_that_cannot_fill_the_site_lane_is_cut_by_its_refusals_alone(lanes: RateLanes,
                                                                                 clock: FakeClock) -> None:
    """One identity of 3 r/s under a site lane of 8: its refusals are its own limit's."""
    waits(lanes, [SITE, ALICE], 1)
    for _ in range(3):
        throttle_as(lanes, ALICE)
        clock.now += 100.0
    assert factors(lanes, ALICE) == pytest.approx([0.125])


def test_an_identity_of_another_source_throttled_does_not_corroborate(lanes: RateLanes) -> None:
    lanes.feedback([ELSEWHERE], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=THROTTLE,
                   pooled_identity=True)
    throttle_as(lanes, ALICE)
    assert factors(lanes, SITE) == [None]


def test_a_throttle_with_a_retry_after_cuts_and_floors_the_source_lane_for_one_identity(lanes: RateLanes) -> None:
    throttle_as(lanes, ALICE, retry_after_s=30.0)
    assert factors(lanes, SITE, ALICE) == pytest.approx([0.5, 0.5])
    assert lanes.reserve([SITE], max_wait_s=60.0).wait_s == pytest.approx(30.0)


def test_a_retry_after_floors_the_lane_of_the_identity_it_was_sent_as(lanes: RateLanes) -> None:
    waits(lanes, [SITE, ALICE], 1)  # the identity's lane has its row: the floor is an update of it
    throttle_as(lanes, ALICE, retry_after_s=30.0)
    assert lanes.reserve([ALICE], max_wait_s=60.0).wait_s == pytest.approx(30.0)


def test_with_corroborate_s_zero_every_throttle_cuts_the_source_lane(lanes: RateLanes) -> None:
    always = THROTTLE.model_copy(update={"corroborate_s": 0.0})
    lanes.feedback([SITE, ALICE], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=always,
                   pooled_identity=True)
    assert factors(lanes, SITE, ALICE) == pytest.approx([0.5, 0.5])


def test_a_throttle_of_the_fleets_own_direct_address_cuts_the_source_lane(lanes: RateLanes) -> None:
    """Without a pool every request leaves from one address: its refusal is the site's answer."""
    direct = LaneSpec("identity:site:direct", rate_per_s=3.0, burst=2, guard_rhythm=True)
    lanes.feedback([SITE, direct], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=THROTTLE)
    assert factors(lanes, SITE, direct) == pytest.approx([0.5, 0.5])


# -- a throttle that repeats the one its identity's lane was cut for --------------------------------


def test_an_identity_s_throttle_within_its_cut_hold_repeats_the_cut_and_one_after_it_does_not(
    lanes: RateLanes, clock: FakeClock
) -> None:
    assert throttle_as(lanes, ALICE) is False  # it cut the lane
    clock.now += THROTTLE.cut_hold_s - 0.5
    assert throttle_as(lanes, ALICE) is True  # a request that left before the cut took hold
    clock.now += 1.0
    assert throttle_as(lanes, ALICE) is False  # past the hold: cut again
    assert factors(lanes, ALICE) == pytest.approx([0.25])


def test_another_identity_s_recent_cut_does_not_make_a_throttle_a_repeat(lanes: RateLanes) -> None:
    throttle_as(lanes, ALICE)
    assert throttle_as(lanes, BOB) is False


def test_a_success_or_a_throttle_of_the_direct_address_is_never_a_repeat(lanes: RateLanes) -> None:
    direct = LaneSpec("identity:site:direct", rate_per_s=3.0, burst=2, guard_rhythm=True)
    for _ in range(2):
        assert lanes.feedback([SITE, direct], outcome=Outcome.THROTTLED, retry_after_s=None,
                              throttle=THROTTLE) is False
    assert lanes.feedback([SITE, ALICE], outcome=Outcome.OK, retry_after_s=None, throttle=THROTTLE,
                          pooled_identity=True) is False


def test_an_identity_lane_s_statement_agrees_with_the_reference_rules_at_its_share(lanes: RateLanes,
                                                                                  clock: FakeClock) -> None:
    """Four identities of 3 r/s share a site lane of 8 r/s: Alice's share is 2/3 of her rate, which
    both her cuts (a floor) and her climbs (a cap, with the headroom) keep to."""
    pool = _pool_of_four(lanes)
    rng, expected = random.Random(5), aimd.AimdState()
    for _ in range(300):
        clock.now += rng.expovariate(1.0) * rng.choice([0.2, 2.0, 40.0])
        _keep_sending(lanes, pool[1:])
        throttled = rng.random() < 0.25
        lanes.feedback([SITE, ALICE], outcome=Outcome.THROTTLED if throttled else Outcome.OK, retry_after_s=None,
                       throttle=THROTTLE, pooled_identity=True)
        expected = (aimd.on_throttle(expected, clock.now, THROTTLE, fair_share=2 / 3) if throttled else
                    aimd.on_success(expected, clock.now, THROTTLE, fair_share=2 / 3, rate_per_s=ALICE.rate_per_s))
        state = lanes.state(ALICE.name)
        assert state is not None
        assert state.aimd_state == expected
    assert factors(lanes, SITE) == pytest.approx([1.0])  # one identity's refusals never cut the site


def test_an_identity_climbs_back_no_higher_than_its_share_of_the_site_lane(lanes: RateLanes,
                                                                           clock: FakeClock) -> None:
    pool = _pool_of_four(lanes)
    throttle_as(lanes, ALICE)  # cut to its share, 2/3; the ceiling stays at 1.0
    for _ in range(100):  # long past the hold
        clock.now += 2.0
        _keep_sending(lanes, pool[1:])
        lanes.feedback([SITE, ALICE], outcome=Outcome.OK, retry_after_s=None, throttle=THROTTLE, pooled_identity=True)
    assert factors(lanes, ALICE) == pytest.approx([2 / 3 * (1 + THROTTLE.share_headroom)])


def test_identities_that_stopped_sending_leave_their_share_to_those_still_sending(lanes: RateLanes,
                                                                                 clock: FakeClock) -> None:
    """Two of the four identities went quiet: the two left cannot fill the site lane (2 x 3 r/s
    under 8), so neither keeps to a share and Alice climbs back to her learned ceiling."""
    _pool_of_four(lanes)
    throttle_as(lanes, ALICE)
    for _ in range(100):
        clock.now += 2.0
        _keep_sending(lanes, [BOB])
        lanes.feedback([SITE, ALICE], outcome=Outcome.OK, retry_after_s=None, throttle=THROTTLE, pooled_identity=True)
    assert factors(lanes, ALICE) == pytest.approx([1.0])
