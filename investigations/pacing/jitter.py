"""Timing that does not look mechanical, without ever sending faster than a source allows.

A fixed delay (or a delay with uniform jitter) is a fingerprint, and so is a strict grid of slots:
both show as a sharp peak at one period. People pause irregularly, with now and then a long break.
Two draws shape a lane's traffic:
- slots: each slot follows the previous one by the permitted interval times (1 + a small
  heavy-tailed slack). Never shorter than the interval, so no window ever holds more than a strict
  limiter allows; the slack makes the grid's phase wander, so no period survives more than a few
  slots. It costs `slot_slack` of throughput on average (4 %).
- sends: each request leaves a heavy-tailed delay after its slot opens (median half an interval,
  capped at one), now and then after a long pause. That makes gaps between sends vary widely.
- turns: identities sharing a busy lane would take its slots in a fixed order; one whose last send
  waited behind others thinks a while (on the scale of its own period) before asking again.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

DELAY_MEDIAN = 0.5  # of the interval: sends spread over their slot, which blurs its period most
THINK_MEDIAN = 0.3  # of an identity's own period: enough to shuffle the turns, little enough to keep the lane busy
SLACK_SIGMA = 1.0  # lognormal spread of the slot slack: mostly tiny, now and then a real hold-up


@dataclass(frozen=True)
class GapSampler:
    """Draws slot spacings and send delays for the rate lanes (see the module doc).

    `sigma` 0 with `pause_probability` 0 is an exact sampler: slots exactly one interval apart and
    no send delay, for tests that need exact arithmetic.
    """

    rng: random.Random
    sigma: float = 0.5  # spread of the send delay (lognormal sigma is twice this)
    pause_probability: float = 0.03
    pause_range: tuple[float, float] = (3.0, 10.0)  # a long pause, in intervals
    slot_slack: float = 0.04  # mean extra spacing between slots, as a share of the interval
    _slack_mu: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        low, high = self.pause_range
        if self.sigma < 0:
            raise ValueError(f"sigma ({self.sigma}) must be >= 0")
        if not 0 <= self.pause_probability < 1:
            raise ValueError(f"pause_probability ({self.pause_probability}) must be in [0, 1)")
        if not 0 < low <= high:
            raise ValueError(f"pause_range {self.pause_range} must be 0 < low <= high")
        if not 0 < self.slot_slack <= 0.15:
            raise ValueError(f"slot_slack ({self.slot_slack}) must be in (0, 0.15]: it is throughput given up")
        # Lognormal mean is exp(mu + s^2/2); solve mu so the slack's mean is exactly slot_slack.
        object.__setattr__(self, "_slack_mu", math.log(self.slot_slack) - SLACK_SIGMA**2 / 2)

    def slot_units(self) -> float:
        """The next slot's distance from this one, in intervals: 1 + slack, never below 1."""
        if self.sigma == 0:
            return 1.0
        return 1.0 + self.rng.lognormvariate(self._slack_mu, SLACK_SIGMA)

    def send_delay_s(self, interval_s: float) -> float:
        """How long after its slot opens a request leaves."""
        if self.rng.random() < self.pause_probability:
            return interval_s * self.rng.uniform(*self.pause_range)
        if self.sigma == 0:
            return 0.0
        return interval_s * min(1.0, DELAY_MEDIAN * self.rng.lognormvariate(0.0, 2 * self.sigma))

    def think_s(self, period_s: float) -> float:
        """How long an identity waits before asking for its next slot, when a shared lane busy with
        other identities set its last send. Identities that take the next free slot of a shared
        lane as soon as their answer is back take the slots in a fixed turn, and each one's sends
        fall on a period (N slots) that a site watching one address sees; a heavy-tailed think,
        on the scale of that period (capped at one), shuffles the turns. It costs no throughput
        while other identities are ready to take the slots it leaves."""
        if self.sigma == 0:
            return 0.0
        return period_s * min(1.0, THINK_MEDIAN * self.rng.lognormvariate(0.0, 2 * self.sigma))


def jittered_start_s(period_s: float, *, rng: random.Random, spread: float = 0.1) -> float:
    """A random offset in [0, spread x period_s) for a schedule or sensor start.

    Fleets that all start on the minute hit a source together; a per-deployment offset spreads them.
    """
    if period_s < 0:
        raise ValueError(f"period_s ({period_s}) must be >= 0")
    if not 0 <= spread <= 1:
        raise ValueError(f"spread ({spread}) must be in [0, 1]")
    # random() is in [0, 1), so the offset never reaches the bound (uniform() may, by rounding).
    return rng.random() * spread * period_s
