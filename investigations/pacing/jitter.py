"""Timing that does not look mechanical: heavy-tailed gaps between requests, jittered start times.

A fixed delay (or a delay with uniform jitter) is a fingerprint: its gaps cluster tightly around one
value. People pause irregularly, with now and then a long break. The sampler draws gaps like that
while keeping the long-run mean at or just above the permitted interval, so jitter never buys rate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

# The mean gap may exceed the interval by at most this much: jitter costs a little throughput, no more.
MAX_MEAN_RATIO = 1.15


@dataclass(frozen=True)
class GapSampler:
    """Draws request gaps: lognormal (`sigma`) with an occasional long pause, mean = `mean_ratio` x interval.

    The scale is derived, not tuned: with pause probability p and pauses of interval x U(a, b), the
    mean gap is interval x (p(a+b)/2 + (1-p) exp(mu + sigma^2/2)); `mu` is solved so that this equals
    `mean_ratio` x interval.
    """

    rng: random.Random
    sigma: float = 0.5
    pause_probability: float = 0.03
    pause_range: tuple[float, float] = (3.0, 10.0)
    # 10% headroom: a finite run's sample mean stays above the interval, and between pauses the
    # lognormal part still runs within ~7% of the permitted rate (see the scale derivation above).
    mean_ratio: float = 1.10
    _mu: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        low, high = self.pause_range
        if self.sigma < 0:
            raise ValueError(f"sigma ({self.sigma}) must be >= 0")
        if not 0 <= self.pause_probability < 1:
            raise ValueError(f"pause_probability ({self.pause_probability}) must be in [0, 1)")
        if not 0 < low <= high:
            raise ValueError(f"pause_range {self.pause_range} must be 0 < low <= high")
        if not 1.0 <= self.mean_ratio <= MAX_MEAN_RATIO:
            raise ValueError(f"mean_ratio ({self.mean_ratio}) must be in [1.0, {MAX_MEAN_RATIO}]")
        pause_share = self.pause_probability * (low + high) / 2
        body_mean = (self.mean_ratio - pause_share) / (1 - self.pause_probability)
        if body_mean <= 0:
            raise ValueError(
                f"pauses alone (probability {self.pause_probability}, range {self.pause_range}) make the "
                f"mean gap {pause_share:.3f} x interval, above mean_ratio {self.mean_ratio}"
            )
        # Lognormal mean is exp(mu + sigma^2/2); solve it for the body's share of the mean.
        object.__setattr__(self, "_mu", math.log(body_mean) - self.sigma**2 / 2)

    def gap_s(self, interval_s: float) -> float:
        """A gap to leave after a request on a lane whose permitted interval is `interval_s`.

        Linear in `interval_s` (one unit draw scaled), so a caller may draw `gap_s(1.0)` and scale it
        later by an interval it learns only then (the rate lanes do, inside their SQL statement).
        """
        if self.rng.random() < self.pause_probability:
            return interval_s * self.rng.uniform(*self.pause_range)
        return interval_s * self.rng.lognormvariate(self._mu, self.sigma)


DELAY_MEDIAN = 0.5  # of the interval: sends spread over their slot, which blurs its period most


def send_delay_s(sampler: GapSampler, interval_s: float) -> float:
    """How long after its slot a request leaves.

    The rate lanes space their slots exactly by the permitted interval, so no window ever holds more
    requests than the source allows (a jittered slot spacing would bunch up now and then, and a
    strict limiter counts every bunch). The sends are what a source sees: each leaves a heavy-tailed
    delay after its slot (lognormal, median DELAY_MEDIAN x interval, capped at one interval), and now
    and then after a long pause. Gaps between sends then vary around the interval, with no period.
    A sampler with sigma 0 and no pauses gives no delay: exact spacing, for tests.
    """
    if sampler.rng.random() < sampler.pause_probability:
        return interval_s * sampler.rng.uniform(*sampler.pause_range)
    if sampler.sigma == 0:
        return 0.0
    # Twice the gap sigma: a delay confined to one interval needs a wider spread to blur the period.
    return interval_s * min(1.0, DELAY_MEDIAN * sampler.rng.lognormvariate(0.0, 2 * sampler.sigma))


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
