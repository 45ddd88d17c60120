"""Waiting for the rate lanes: how one request of a process gets its slot on its source's and its
identity's lanes (the lanes themselves, shared by every process, are `RateLanes`).

Three rules live here, each with its reason:
- background work (recurring crawls, backfills) books a slot at most BACKGROUND_AHEAD_INTERVALS
  (and at least BACKGROUND_AHEAD_S) ahead, so the later slots stay free for fresh leads, which
  book without a horizon;
- a process's background requests for one source ask the lanes one at a time (the source's gate):
  standing back means asking again when a slot comes near, and a batch's threads all asking at
  every slot would cost a transaction each;
- an identity whose last send waited behind other identities on the source lane thinks first (on
  the scale of its own period), so identities sharing a busy source do not take its slots in a
  fixed turn (see GapSampler.think_s). Background requests do not think (see `LaneWaiter.wait`);
- a request that wakes for its slot more than one interval late (a stalled process: the GC, a busy
  CPU, a slow database) asks for a new slot instead of sending: every thread of a stalled process
  wakes late at once, and sending them all would put a burst on the wire that the lanes never
  booked, past a strict limiter's allowance. At most MAX_REBOOKS times per request, then it goes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from investigations.pacing.lanes import LaneSpec, RateLanes, Reservation

if TYPE_CHECKING:
    from investigations.sources.specs import SourceSpec

log = logging.getLogger(__name__)

# Background work books a lane's slot at most this many intervals ahead, so a busy lane's queue is
# never a batch's: a fresh lead's request waits a slot or two, not behind every waiting batch thread.
BACKGROUND_AHEAD_INTERVALS = 1.0
# ... or as many intervals as this long holds at the source's configured rate: on a fast source one
# interval is a few tens of milliseconds, too close for a batch's threads, one booking at a time, to
# keep the lane's next slot taken (measured at 30 r/s on the product bench, 150 s: 0.968 of the
# ceiling with 3 threads, 0.907 with 5; 0.987 with 5 and 4 intervals). The horizon counts the
# binding lane's intervals: on the source lane at its configured rate it is this long; on a slower
# lane (an identity's, or one AIMD slowed) it is longer in seconds by as much.
BACKGROUND_AHEAD_S = 0.15
# An identity's turns on a shared source lane are tracked only while it sends within this many of
# the source's intervals of its last send.
TURN_MAX_INTERVALS = 20
# A send that waited more than this many of the source's intervals had other identities ahead of it
# (alone, an identity waits at most one: its own previous slot).
TURN_BEHIND_INTERVALS = 1.5
# A send this many of its tightest lane's intervals later than its slot books a new one; a request
# does so at most MAX_REBOOKS times (a process that is always late must still send).
LATE_INTERVALS = 1.0
MAX_REBOOKS = 3


def background_ahead_intervals(spec: SourceSpec) -> float:
    """How many intervals ahead a background request of `spec` may book: BACKGROUND_AHEAD_INTERVALS,
    or as many as BACKGROUND_AHEAD_S holds at the source's rate."""
    return max(BACKGROUND_AHEAD_INTERVALS, BACKGROUND_AHEAD_S * spec.rate.source_per_s)


class LaneFull(Exception):
    """The lanes will not let the request out before it should park: `wait_s` until they would."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(f"rate lane full for {wait_s:.0f} s")
        self.wait_s = wait_s


@dataclass(frozen=True)
class _Turn:
    sent_at_s: float
    period_s: float | None  # since the identity's previous send, when it was taking turns
    behind_others: bool  # its send waited behind other identities on the source lane


class LaneWaiter:
    """Sleeps a process's requests until their lanes let them out; one per fetcher.

    Clock and sleep are injected (the fetcher's), so tests keep exact time.
    """

    def __init__(self, lanes: RateLanes, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, max_wait_s: float = 30.0) -> None:
        self.lanes = lanes
        self._sleep = sleep
        self._clock = clock
        self._max_wait_s = max_wait_s
        # Per identity lane: when it last sent and whether it waited behind other identities then.
        self._turns: dict[str, _Turn] = {}
        # Per source lane: the gate a process's background requests pass one at a time.
        self._gates: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self.rebooked = 0  # requests that woke too late for their slot and booked another

    def wait(self, spec: SourceSpec, lanes: Sequence[LaneSpec], park_at: float | None, *,
             background: bool = False) -> None:
        """Sleep until the source's and the identity's lanes let one more request out.

        `lanes` is [source lane, identity lane]; `park_at` is when a run of throttled answers turns
        into parking (else the source's `park_after_s` from now). Raises LaneFull when the lanes
        would hold the request past that.
        """
        source, own = lanes[0].name, lanes[-1].name
        turn = self._turns.get(own)
        # Background requests do not think: standing back, they ask again after a random part of an
        # interval (see reserve), which shuffles their turns already; and an identity sends one
        # request at a time, so a think while a batch keeps every identity busy is its rate lost.
        if turn is not None and turn.behind_others and turn.period_s is not None and not background:
            self._sleep(self.lanes.think_s(turn.period_s))
        give_up_at = park_at if park_at is not None else self._clock() + spec.throttle.park_after_s
        late_limit_s = LATE_INTERVALS / max(spec.rate.source_per_s, spec.rate.identity_per_s)
        for rebook in range(MAX_REBOOKS + 1):
            reservation, yielded_to_others = self._reserve(spec, lanes, give_up_at, background=background)
            planned_at = self._clock() + reservation.wait_s
            self._sleep(reservation.wait_s)
            late_s = self._clock() - planned_at
            if late_s <= late_limit_s or rebook == MAX_REBOOKS:
                break
            self.rebooked += 1
            log.info("late for its slot by %.3f s (limit %.3f s): booked again: lane=%s", late_s, late_limit_s,
                     lanes[-1].name)
        sent_at = self._clock()
        # A period longer than a few source intervals is an identity coming back from idle, not one
        # taking turns: it has no turn to shuffle.
        period = sent_at - turn.sent_at_s if turn is not None else None
        if period is not None and period > TURN_MAX_INTERVALS / spec.rate.source_per_s:
            period = None
        behind = yielded_to_others or (reservation.held_by == source
                                       and reservation.held_intervals > TURN_BEHIND_INTERVALS)
        self._turns[own] = _Turn(sent_at_s=sent_at, period_s=period, behind_others=behind)

    def _reserve(self, spec: SourceSpec, lanes: Sequence[LaneSpec], give_up_at: float, *,
                 background: bool) -> tuple[Reservation, bool]:
        """A granted reservation on `lanes`, and whether a background request stood back for it while
        the source lane was booked by others; raises LaneFull past `give_up_at`."""
        source = lanes[0].name
        yielded_to_others = False
        while True:
            # The one asking books its slot (or hears why not: a floor, a full lane), then lets the next ask.
            with self._gate(source) if background else nullcontext():
                while True:
                    reservation = self.lanes.reserve(
                        lanes, max_wait_s=self._max_wait_s,
                        max_ahead_intervals=background_ahead_intervals(spec) if background else None)
                    if reservation.yield_s <= 0:
                        break
                    # Background work books only near slots: the later ones stay free for fresh leads.
                    yielded_to_others = yielded_to_others or reservation.held_by == source
                    self._sleep(reservation.yield_s)
            if reservation.granted:
                return reservation, yielded_to_others
            if self._clock() + reservation.wait_s >= give_up_at:
                raise LaneFull(reservation.wait_s)
            if reservation.rhythm_extra_s > 0:
                # The rhythm guard set the identity's lane a floor: nothing opens before it.
                self._sleep(reservation.wait_s)
            else:
                # Nothing was reserved: wait part of the way and ask again, so a lane that speeds up
                # (AIMD recovering) is used as soon as it does.
                self._sleep(min(reservation.wait_s, self._max_wait_s) / 2)

    def _gate(self, source_lane_name: str) -> threading.Lock:
        with self._lock:
            return self._gates.setdefault(source_lane_name, threading.Lock())
