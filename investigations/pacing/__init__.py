"""Pacing: rate lanes (shared GCRA), heavy-tailed jitter, AIMD slow-down, per-source circuit breakers,
and one request's throttle (`throttle.RequestPacing`: when it goes, and retry, wait or park).

Plain Python with time and randomness injected, so every rule is testable in milliseconds.
"""

from investigations.pacing import aimd
from investigations.pacing.circuit import (
    CLOSED,
    CircuitDecision,
    CircuitEvent,
    Circuits,
    CircuitState,
    CircuitStateName,
    cooldown_s,
    next_state,
)
from investigations.pacing.jitter import GapSampler, jittered_start_s
from investigations.pacing.lanes import (
    LaneSpec,
    LaneState,
    RateLanes,
    Reservation,
    identity_lane,
    source_lane,
)

__all__ = [
    "CLOSED",
    "CircuitDecision",
    "CircuitEvent",
    "CircuitState",
    "CircuitStateName",
    "Circuits",
    "GapSampler",
    "LaneSpec",
    "LaneState",
    "RateLanes",
    "Reservation",
    "aimd",
    "cooldown_s",
    "identity_lane",
    "jittered_start_s",
    "next_state",
    "source_lane",
]
