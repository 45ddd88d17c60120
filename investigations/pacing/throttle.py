"""The pacing of one request across its attempts: when each may go, and what to do after each answer.

`RequestPacing.after` keeps the rules in one method, one commented rule per branch, as Scrapy's
AutoThrottle keeps its own. The fetcher sends, classifies and records; it asks this class when to
send (`slot`) and what an answer calls for (`after`), and does what the step says.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from investigations.collection.classify import backoff_delay_s, next_step
from investigations.collection.events import Outcome
from investigations.pacing.lanes import RateLanes, identity_lane, source_lane
from investigations.pacing.waiting import LaneFull, LaneWaiter

if TYPE_CHECKING:
    from investigations.sources.specs import SourceSpec


@dataclass(frozen=True)
class Step:
    """What the request does next: `done` (the answer is usable), `retry` after `delay_s`, `park`
    (come back in `delay_s`, not a failure), or `give_up` (`reason` says why)."""

    action: Literal["done", "retry", "park", "give_up"]
    delay_s: float
    reason: str
    # The answer repeats a throttle its identity's lane was just cut for (see RateLanes.feedback):
    # it answers a request that left before the cut took hold, so it is held against nobody.
    repeat: bool = False


class RequestPacing:
    """One request's pacing: its slots on the source's and its identity's lanes (shared by every
    process, waited for by the process's `LaneWaiter`), adaptive slow-down from what the source
    answers, backoff with jitter, and when being throttled turns into parking. Clock and randomness
    are the fetcher's, so tests keep exact time."""

    def __init__(self, spec: SourceSpec, identity_id: str, *, waiter: LaneWaiter | None, pooled_identity: bool,
                 background: bool, rng: random.Random, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.lanes = [source_lane(spec), identity_lane(spec, identity_id)]
        self._waiter = waiter
        self._shared: RateLanes | None = waiter.lanes if waiter is not None else None
        self._pooled_identity = pooled_identity
        self._background = background
        self._rng = rng
        self._clock = clock
        self.sent = 0  # attempts sent, 429s included
        self.attempts = 0  # attempts that spent the retry budget (a 429 does not)
        self.throttled = 0  # answers in a row that asked us to slow down
        self.park_at: float | None = None  # when the current run of throttling turns into parking

    def slot(self) -> Step | None:
        """Wait until the lanes let the next attempt out (None: send it now); a `park` step when they
        would hold it past when it should park. `background` work (recurring crawls, backfills)
        leaves the lanes' later slots to fresh leads (see `pacing.waiting`)."""
        if self._waiter is not None:
            try:
                self._waiter.wait(self.spec, self.lanes, self.park_at, background=self._background)
            except LaneFull as full:
                return Step("park", full.wait_s, str(full))
        self.sent += 1
        return None

    def after(self, outcome: Outcome, *, slow_down: bool, timed_out: bool, retry_after_s: float | None) -> Step:
        """What the request does after an answer with `outcome`, one rule per branch."""
        throttle = self.spec.throttle
        repeat = False
        if self._shared is not None:
            # Every answer tells the shared lanes how the source copes: a throttle or a timeout cuts
            # the lanes' rate (AIMD), a success raises it slowly, Retry-After sets a floor. Sent
            # through a proxy of the pool, a throttle may be that one address's (RateLanes.feedback).
            repeat = self._shared.feedback(self.lanes, outcome=outcome, timed_out=timed_out,
                                           retry_after_s=retry_after_s, throttle=throttle,
                                           pooled_identity=self._pooled_identity)
        if slow_down:
            # Being told to slow down is not the request failing: wait (Retry-After a floor under a
            # jittered backoff; the lane already slowed) without spending an attempt...
            self.throttled += 1
            if self.park_at is None:
                self.park_at = self._clock() + throttle.park_after_s
            delay_s = max(retry_after_s or 0.0, backoff_delay_s(
                self.throttled, base_delay_s=self.spec.retry.base_delay_s, max_delay_s=self.spec.retry.max_delay_s,
                rng=self._rng))
            if self._clock() + delay_s >= self.park_at:
                # ...until it has lasted `park_after_s`: then the work parks (back in the queue), not fails.
                return Step("park", max(delay_s, throttle.park_after_s / 4),
                            f"throttled {self.throttled} time(s) in {throttle.park_after_s:.0f} s", repeat)
            return Step("retry", delay_s, f"throttled {self.throttled} time(s)", repeat)
        # Any other answer ends a run of throttling and spends one attempt of the retry budget.
        self.park_at, self.throttled = None, 0
        self.attempts += 1
        # The retry policy decides the rest (classify.next_step): done when the answer is usable; give
        # up when retrying cannot help or the attempts are spent; else retry after a full-jitter
        # backoff, Retry-After a floor under it.
        step = next_step(outcome, attempt=self.attempts, retry=self.spec.retry, retry_after_s=retry_after_s,
                         rng=self._rng)
        return Step(step.action, step.delay_s, step.reason, repeat)
