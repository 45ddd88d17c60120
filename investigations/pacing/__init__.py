"""Pacing: rate lanes (shared GCRA), heavy-tailed jitter, AIMD slow-down, per-source circuit breakers,
and one request's throttle (`throttle.RequestPacing`: when it goes, and retry, wait or park).

Plain Python with time and randomness injected, so every rule is testable in milliseconds.
"""


from investigations.pacing.circuit import Circuits
from investigations.pacing.jitter import GapSampler, jittered_start_s
from investigations.pacing.lanes import RateLanes

__all__ = [
    "Circuits",
    "GapSampler",
    "RateLanes",
    "jittered_start_s",
]
