"""Circuit breaker per source: after a run of failed collections the source rests, then one probe.

closed --(failure_threshold failures in a row)--> open --(cooldown over, one caller)--> half_open
half_open --(probe succeeds)--> closed;  half_open --(probe fails)--> open, with a doubled cooldown.

The transitions are one pure function (`next_state`); `Circuits` keeps the state in the store so
every process sees the same circuit and exactly one of them sends the probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from sqlalchemy import Connection, RowMapping, select, update
from sqlalchemy.dialects import postgresql, sqlite

from investigations.store import schema as s
from investigations.store.state import StateStore

if TYPE_CHECKING:  # specs pull in pydantic; pacing only needs their attributes at run time
    from investigations.sources.specs import CircuitSpec

CircuitStateName = Literal["closed", "open", "half_open"]
CircuitEvent = Literal["success", "failure", "probe"]

_T = s.circuits
# 2**60 x any sane cooldown is far past max_cooldown_s; the cap keeps the power from overflowing a float.
_MAX_DOUBLINGS = 60


@dataclass(frozen=True)
class CircuitState:
    """A source's circuit: its state, the current failure streak, and when it opened and may probe."""

    state: CircuitStateName
    failure_streak: int
    opened_at_s: float | None
    probe_at_s: float | None
    opens: int  # consecutive opens without a closing success; the cooldown doubles with each


CLOSED = CircuitState(state="closed", failure_streak=0, opened_at_s=None, probe_at_s=None, opens=0)


@dataclass(frozen=True)
class CircuitDecision:
    """May a collection of the source go now? `probe` marks the one call that tests a resting source."""

    allowed: bool
    probe: bool
    reason: str
    retry_in_s: float


def cooldown_s(opens: int, policy: CircuitSpec) -> float:
    """The rest after `opens` earlier consecutive opens: cooldown_s x 2^opens, capped at max_cooldown_s."""
    return min(policy.max_cooldown_s, policy.cooldown_s * 2.0 ** min(opens, _MAX_DOUBLINGS))


def next_state(
    state: CircuitState, event: CircuitEvent, *, now_s: float, policy: CircuitSpec
) -> CircuitState:
    """The circuit after `event` at `now_s`; an event that does not apply leaves it unchanged."""
    match state.state, event:
        case "closed", "success":
            # Only failures in a row count: one success clears the streak.
            return replace(state, failure_streak=0)
        case "closed", "failure":
            streak = state.failure_streak + 1
            if streak >= policy.failure_threshold:
                return _open(state, streak, now_s, policy)
            return replace(state, failure_streak=streak)
        case ("open" | "half_open"), "probe" if state.probe_at_s is not None and now_s >= state.probe_at_s:
            # From half_open this takes over a probe whose answer never came (a crashed worker): the
            # probe holds the source for at most max_cooldown_s, so a lost probe can't shut it for good.
            return replace(state, state="half_open", probe_at_s=now_s + policy.max_cooldown_s)
        case "half_open", "success":
            # The probe got through: the source is back, and its next rest starts from cooldown_s again.
            return CLOSED
        case "half_open", "failure":
            return _open(state, state.failure_streak + 1, now_s, policy)
        case _:
            # open + success/failure: late answers to requests sent before it opened; they neither
            # close it early nor extend the rest. A probe before probe_at, or while closed, is refused.
            return state


def _open(state: CircuitState, streak: int, now_s: float, policy: CircuitSpec) -> CircuitState:
    return CircuitState(
        state="open",
        failure_streak=streak,
        opened_at_s=now_s,
        probe_at_s=now_s + cooldown_s(state.opens, policy),
        opens=state.opens + 1,
    )


class Circuits:
    """Circuit breakers of every source, shared by all processes through the state store."""

    def __init__(self, store: StateStore, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    def allow(self, source: str, policy: CircuitSpec) -> CircuitDecision:
        """Whether a collection of `source` may go now.

        Closed: yes. Open and resting: no, with the time left. Rest over: exactly one caller across
        all processes wins the probe (a conditional UPDATE that only one transaction can match);
        everyone else waits while the probe is out.
        """
        now = self._clock()
        # Read first, without the write lock (SQLite has one writer, and every collection asks):
        # a closed circuit, as nearly always, needs nothing written.
        if self._closed(source):
            return CircuitDecision(allowed=True, probe=False, reason="closed", retry_in_s=0.0)
        with self._store.engine.begin() as conn:
            current = _read(conn, source)
            if current is None or current.state == "closed":
                return CircuitDecision(allowed=True, probe=False, reason="closed", retry_in_s=0.0)
            # record() always writes a probe time with open and half_open; the fallback is for typing.
            probe_at = current.probe_at_s if current.probe_at_s is not None else now
            if now < probe_at:
                if current.state == "open":
                    return CircuitDecision(
                        allowed=False,
                        probe=False,
                        reason=f"open after {current.failure_streak} failures in a row; resting",
                        retry_in_s=probe_at - now,
                    )
                # The probe usually answers within a collection; check back after a base cooldown.
                return CircuitDecision(
                    allowed=False,
                    probe=False,
                    reason="half_open: a probe is out",
                    retry_in_s=min(probe_at - now, policy.cooldown_s),
                )
            probing = next_state(current, "probe", now_s=now, policy=policy)
            won = conn.execute(
                update(_T)
                .where(_T.c.source == source, _T.c.state == current.state, _T.c.probe_at_s <= now)
                .values(state=probing.state, probe_at_s=probing.probe_at_s, updated_at_s=now)
            ).rowcount
        if won == 1:
            return CircuitDecision(allowed=True, probe=True, reason="probe: the rest is over", retry_in_s=0.0)
        return CircuitDecision(
            allowed=False, probe=False, reason="half_open: another caller took the probe",
            retry_in_s=policy.cooldown_s,
        )

    def record(self, source: str, policy: CircuitSpec, *, success: bool) -> CircuitState:
        """Apply a collection's result to the source's circuit (one transaction) and return the new state.
        A success that changes nothing (a closed circuit with no failure in its streak) is only read:
        the state store has one writer on SQLite, and nearly every collection is such a success."""
        now = self._clock()
        if success and (current := self.state(source)) is not None and current == next_state(
                current, "success", now_s=now, policy=policy):
            return current
        with self._store.engine.begin() as conn:
            insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(_T)
            # Insert-if-missing first, so the locking read below always finds a row to lock.
            conn.execute(
                insert.values(
                    source=source, state=CLOSED.state, failure_streak=CLOSED.failure_streak, opened_at_s=None,
                    probe_at_s=None, opens=CLOSED.opens, updated_at_s=now,
                ).on_conflict_do_nothing(index_elements=[_T.c.source])
            )
            current = _read(conn, source, lock=True) or CLOSED
            new = next_state(current, "success" if success else "failure", now_s=now, policy=policy)
            conn.execute(
                update(_T)
                .where(_T.c.source == source)
                .values(
                    state=new.state,
                    failure_streak=new.failure_streak,
                    opened_at_s=new.opened_at_s,
                    probe_at_s=new.probe_at_s,
                    opens=new.opens,
                    updated_at_s=now,
                )
            )
        return new

    def _closed(self, source: str) -> bool:
        """Whether the stored circuit is closed (no row yet: closed); a read."""
        current = self.state(source)
        return current is None or current.state == "closed"

    def state(self, source: str) -> CircuitState | None:
        """The stored circuit of `source`, or None if it never recorded a result (i.e. closed)."""
        with self._store.reading() as conn:
            return _read(conn, source)

    def all_states(self) -> dict[str, CircuitState]:
        """Every stored circuit by source name (for the fleet status and the CLI)."""
        with self._store.reading() as conn:
            rows = conn.execute(select(_T).order_by(_T.c.source)).mappings().all()
        return {row["source"]: _from_row(row) for row in rows}


def _read(conn: Connection, source: str, *, lock: bool = False) -> CircuitState | None:
    query = select(_T).where(_T.c.source == source)
    if lock:
        query = query.with_for_update()  # Postgres row lock; SQLite's BEGIN IMMEDIATE already holds the file
    row = conn.execute(query).mappings().first()
    return _from_row(row) if row else None


def _from_row(row: RowMapping) -> CircuitState:
    return CircuitState(
        state=row["state"],
        failure_streak=row["failure_streak"],
        opened_at_s=row["opened_at_s"],
        probe_at_s=row["probe_at_s"],
        opens=row["opens"],
    )
