"""Timing that does not look mechanical, without ever sending faster than a source allows.

A fixed delay (or a delay with uniform jitter) is a fingerprint, and so is a strict grid of slots:
both show as a sharp peak at one period. People pause irregularly, with now and then a long break.
Two draws shape a lane's traffic:
- slots: each slot follows the previous one by the permitted interval times (1 + a small
  heavy-tailed slack). Never shorter than the interval, so no window ever holds more than a strict
  limiter allows; the slack makes the grid's phase wander, so no period survives more than a few
  slots. It costs `slot_slack` of throughput on average (0.5 %): the send delays below blur the
  grid far more than the slack does, so a larger slack only gives up rate.
- sends: each request leaves a heavy-tailed delay after its slot opens (median half an interval,
  capped at one), now and then after a long pause. That makes gaps between sends vary widely.
- turns: identities sharing a busy lane would take its slots in a fixed order; one whose last send
  waited behind others thinks a while (on the scale of its own period) before asking again.
- rhythm guard: the draws make an address's gaps irregular on average, but now and then a run of
  them comes out regular enough for a site to ban the address. An identity's request that would
  close such a run waits until just late enough (and a little more, at random) to break it: a
  floor on the gaps' coefficient of variation instead of luck. It only ever delays, so no limit is
  crossed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

DELAY_MEDIAN = 0.5  # of the interval: sends spread over their slot, which blurs its period most
THINK_MEDIAN = 0.3  # of an identity's own period: enough to shuffle the turns, little enough to keep the lane busy
SLACK_SIGMA = 1.0  # lognormal spread of the slot slack: mostly tiny, now and then a real hold-up

RHYTHM_GAPS = 8  # gaps a site judges an address's rhythm by: the sandbox bans on its last 8
RHYTHM_MIN_CV = 0.2  # floor on stdev/mean of the last 8 gaps: twice the sandbox's 0.1, at little throughput
RHYTHM_SHORT_GAPS = 4  # shortest window checked too: a site may watch fewer gaps than the sandbox does
RHYTHM_SHORT_MIN_CV = 0.15  # floor for 4 to 7 gaps: few gaps vary more by chance; 0.2 there costs 3 %
RHYTHM_SENDS_KEPT = RHYTHM_GAPS + 1  # send times a lane remembers: enough for its longest window
RHYTHM_EXTRA_MEDIAN = 0.25  # of the interval, added beyond the minimum: no pattern of the guard's own
RHYTHM_EXTRA_SIGMA = 1.0  # not the sampler's sigma: the guard must blur even a near-regular sampler


@dataclass(frozen=True)
class GapSampler:
    """Draws slot spacings and send delays for the rate lanes (see the module doc).

    `sigma` 0 with `pause_probability` 0 is an exact sampler: slots exactly one interval apart, no
    send delay and no rhythm extra, for tests that need exact arithmetic.
    """

    rng: random.Random
    sigma: float = 0.5  # spread of the send delay (lognormal sigma is twice this)
    # A pause keeps an identity off its lanes for a while. When a site's limit is nearly all its
    # identities' limits together (3 at 3/s for a site at 8/s), the others cannot take up the slack
    # and the source lane's slots go by unused (bench.product's engine alone: 0.951-0.957 of the
    # ceiling at 3 %, 0.973-0.981 at 1 %); gaps stay irregular (the send delays and the rhythm guard).
    pause_probability: float = 0.01
    pause_range: tuple[float, float] = (3.0, 10.0)  # a long pause, in intervals
    # Mean extra spacing between slots, as a share of the interval: a source lane at the site's own
    # limit reaches 1 / (1 + slot_slack) of it at most (99.5 %), so this is rate given up for good.
    # It only has to make the grid's phase wander; slots never come closer than the interval whatever
    # it is. 1.5 % gave up a point of the product's rate (bench.product: right 0.964 -> 0.978-0.980,
    # defend 0.965 -> 0.981, no refusal and no ban either way).
    slot_slack: float = 0.005
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

    def rhythm_extra_s(self, history_s: Sequence[float], send_at_s: float, interval_s: float) -> float:
        """How much later than `send_at_s` a request must leave so that no window of the last
        RHYTHM_SHORT_GAPS to RHYTHM_GAPS gaps ending at it (after the sends in `history_s`) has a
        coefficient of variation below its floor (RHYTHM_MIN_CV for the full window,
        RHYTHM_SHORT_MIN_CV for shorter ones); 0 when none has, or with a history too short for
        even the shortest window.

        Per window of n gaps, the other n-1 summing to S with squares summing to Q, the new gap x
        passes when n(Q + x^2) >= (1 + f^2)(S + x)^2 (population stdev, as a site computes it): it
        fails only between the quadratic's two roots. The new gap moves to the end of every band
        it is in (ending one band can land it in another window's), then a heavy-tailed extra on
        the scale of `interval_s` is added, so guarded sends do not fall into a pattern of their own.
        """
        if self.sigma == 0:
            return 0.0
        # Sends planned after this one are not before it on the wire: they are not in its windows.
        before = sorted(t for t in history_s if t <= send_at_s)[-RHYTHM_GAPS:]
        if len(before) < RHYTHM_SHORT_GAPS:
            return 0.0
        times = [*before, send_at_s]
        gaps = [b - a for a, b in pairwise(times)]
        last = gaps[-1]
        bands = [_failing_band(gaps[-n:-1], RHYTHM_MIN_CV if n == RHYTHM_GAPS else RHYTHM_SHORT_MIN_CV)
                 for n in range(RHYTHM_SHORT_GAPS, len(gaps) + 1)]
        moved = _past_bands(last, bands)
        if moved == last:
            return 0.0
        extra = interval_s * min(1.0, RHYTHM_EXTRA_MEDIAN * self.rng.lognormvariate(0.0, RHYTHM_EXTRA_SIGMA))
        return _past_bands(moved + extra, bands) - last


def _failing_band(others: Sequence[float], floor: float) -> tuple[float, float]:
    """The open interval of next gaps x that leave the window `others` + [x] with a CV below `floor`."""
    n = len(others) + 1
    total, squares = math.fsum(others), math.fsum(g * g for g in others)
    grow = 1.0 + floor**2
    # n(Q + x^2) < grow (S + x)^2  <=>  a x^2 - 2 grow S x + c < 0, with a = n - grow > 0 for n >= 2.
    a, c = n - grow, n * squares - grow * total**2
    half_b = grow * total
    discriminant = half_b**2 - a * c
    if discriminant <= 0:
        return (0.0, 0.0)  # no x fails
    high = (half_b + math.sqrt(discriminant)) / a
    low = c / (a * high) if high > 0 else high  # the product of the roots is c / a: no cancellation
    return (low, high)


def _past_bands(gap: float, bands: Sequence[tuple[float, float]]) -> float:
    """The least gap >= `gap` inside no band. Each band is passed at most once: gaps only grow."""
    moved = True
    while moved:
        moved = False
        for low, high in bands:
            if low < gap < high:
                gap, moved = high, True
    return gap


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
