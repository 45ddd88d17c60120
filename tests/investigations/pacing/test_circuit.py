"""Circuit breaker: the transition table, and the shared circuits on SQLite and Postgres."""

from __future__ import annotations

import threading

import pytest

from investigations.pacing import Circuits
from investigations.pacing.circuit import CLOSED, CircuitState, next_state
from investigations.sources.specs import CircuitSpec
from investigations.store import StateStore
from tests.fakes import FakeClock, runs_without_the_write_lock

POLICY = CircuitSpec(failure_threshold=3, cooldown_s=10.0, max_cooldown_s=60.0)
NOW = 1_000.0


def circuit(state: str, streak: int = 0, opened: float | None = None, probe: float | None = None,
            opens: int = 0) -> CircuitState:
    return CircuitState(state=state, failure_streak=streak, opened_at_s=opened, probe_at_s=probe,  # type: ignore[arg-type]
                        opens=opens)


@pytest.mark.parametrize(
    ("before", "event", "after"),
    [
        # closed: failures count up, the threshold opens it for cooldown_s
        (CLOSED, "failure", circuit("closed", 1)),
        (circuit("closed", 1), "failure", circuit("closed", 2)),
        (circuit("closed", 2), "failure", circuit("open", 3, NOW, NOW + 10.0, 1)),
        (circuit("closed", 2), "success", CLOSED),
        (CLOSED, "probe", CLOSED),
        # open: resting until probe_at; then one probe turns it half_open, held for max_cooldown_s at most
        (circuit("open", 3, 990.0, 1_005.0, 1), "probe", circuit("open", 3, 990.0, 1_005.0, 1)),
        (circuit("open", 3, 990.0, NOW, 1), "probe", circuit("half_open", 3, 990.0, NOW + 60.0, 1)),
        (circuit("open", 3, 990.0, 1_005.0, 1), "success", circuit("open", 3, 990.0, 1_005.0, 1)),
        (circuit("open", 3, 990.0, 1_005.0, 1), "failure", circuit("open", 3, 990.0, 1_005.0, 1)),
        # half_open: the probe's answer decides; a failure doubles the rest
        (circuit("half_open", 3, 990.0, 1_050.0, 1), "success", CLOSED),
        (circuit("half_open", 3, 990.0, 1_050.0, 1), "failure", circuit("open", 4, NOW, NOW + 20.0, 2)),
        # 10 x 2^3 = 80 s, capped at max_cooldown_s
        (circuit("half_open", 5, 900.0, 1_050.0, 3), "failure", circuit("open", 6, NOW, NOW + 60.0, 4)),
        (circuit("half_open", 3, 990.0, 1_050.0, 1), "probe", circuit("half_open", 3, 990.0, 1_050.0, 1)),
        # a probe whose answer never came is taken over once its hold runs out
        (circuit("half_open", 3, 900.0, NOW, 1), "probe", circuit("half_open", 3, 900.0, NOW + 60.0, 1)),
    ],
)
def test_next_state(before: CircuitState, event: str, after: CircuitState) -> None:
    assert next_state(before, event, now_s=NOW, policy=POLICY) == after  # type: ignore[arg-type]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def circuits(store: StateStore, clock: FakeClock) -> Circuits:
    return Circuits(store, clock=clock)


def fail(circuits: Circuits, times: int) -> None:
    for _ in range(times):
        circuits.record("src", POLICY, success=False)


def test_an_unknown_source_is_closed_and_allowed(circuits: Circuits) -> None:
    decision = circuits.allow("src", POLICY)
    assert (decision.allowed, decision.probe, circuits.state("src")) == (True, False, None)


def test_the_circuit_opens_after_the_failure_threshold(circuits: Circuits) -> None:
    fail(circuits, 2)
    assert circuits.allow("src", POLICY).allowed
    fail(circuits, 1)
    assert circuits.state("src") == circuit("open", 3, NOW, NOW + 10.0, 1)


def test_an_open_circuit_refuses_until_the_cooldown_is_over(circuits: Circuits, clock: FakeClock) -> None:
    fail(circuits, 3)
    clock.now += 4.0
    decision = circuits.allow("src", POLICY)
    assert (decision.allowed, decision.probe) == (False, False)
    assert decision.retry_in_s == pytest.approx(6.0)


def test_exactly_one_of_many_concurrent_callers_gets_the_probe(circuits: Circuits, clock: FakeClock) -> None:
    fail(circuits, 3)
    clock.now += 10.0
    callers = 8
    barrier = threading.Barrier(callers)
    decisions = []

    def call() -> None:
        barrier.wait()
        decisions.append(circuits.allow("src", POLICY))

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    outcomes = sorted((d.allowed, d.probe) for d in decisions)
    assert outcomes == [(False, False)] * (callers - 1) + [(True, True)]
    assert circuits.state("src").state == "half_open"  # type: ignore[union-attr]


def test_a_successful_probe_closes_the_circuit(circuits: Circuits, clock: FakeClock) -> None:
    fail(circuits, 3)
    clock.now += 10.0
    assert circuits.allow("src", POLICY).probe
    circuits.record("src", POLICY, success=True)
    assert circuits.state("src") == CLOSED
    assert circuits.allow("src", POLICY).allowed


def test_a_failed_probe_reopens_with_a_doubled_cooldown(circuits: Circuits, clock: FakeClock) -> None:
    fail(circuits, 3)
    clock.now += 10.0
    assert circuits.allow("src", POLICY).probe
    circuits.record("src", POLICY, success=False)
    decision = circuits.allow("src", POLICY)
    assert (decision.allowed, decision.retry_in_s) == (False, pytest.approx(20.0))


def test_others_wait_while_the_probe_is_out(circuits: Circuits, clock: FakeClock) -> None:
    fail(circuits, 3)
    clock.now += 10.0
    circuits.allow("src", POLICY)
    decision = circuits.allow("src", POLICY)
    assert (decision.allowed, decision.reason) == (False, "half_open: a probe is out")


def test_a_lost_probe_is_taken_over_after_max_cooldown(circuits: Circuits, clock: FakeClock) -> None:
    fail(circuits, 3)
    clock.now += 10.0
    assert circuits.allow("src", POLICY).probe  # ... and its worker dies without recording
    clock.now += POLICY.max_cooldown_s
    assert circuits.allow("src", POLICY).probe


def test_all_states_lists_every_recorded_source(circuits: Circuits) -> None:
    circuits.record("b", POLICY, success=True)
    circuits.record("a", POLICY, success=False)
    assert circuits.all_states() == {"a": circuit("closed", 1), "b": CLOSED}


def test_a_closed_circuit_admits_and_records_a_success_without_waiting_for_a_writer(
    sqlite_store: StateStore, clock: FakeClock
) -> None:
    """Every collection asks the circuit and reports to it; a closed circuit with a clean streak,
    nearly always the case, is read, not written, so it never waits for SQLite's one writer."""
    circuits = Circuits(sqlite_store, clock=clock)
    circuits.record("src", POLICY, success=True)  # the row exists
    assert runs_without_the_write_lock(sqlite_store, lambda: circuits.allow("src", POLICY))
    assert runs_without_the_write_lock(sqlite_store, lambda: circuits.record("src", POLICY, success=True))
    fail(circuits, 1)  # a failure in the streak: the next success clears it, and is written
    assert not runs_without_the_write_lock(sqlite_store, lambda: circuits.record("src", POLICY, success=True),
                                           wait_s=1.0)
    assert circuits.state("src") == CLOSED
