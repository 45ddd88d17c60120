"""Adaptive slow-down (AIMD) of a lane's rate: cut hard when the source pushes back, recover slowly.

The same rule as TCP congestion control: multiplicative decrease backs off fast enough to stop a
throttling storm, additive increase probes back towards the configured rate without overshooting.
The rate lanes apply these rules inside one SQL statement (see `lanes.py`); this module is the
reference the tests hold that SQL to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from investigations.events import Outcome

if TYPE_CHECKING:  # specs pull in pydantic; pacing only needs their attributes at run time
    from investigations.specs import ThrottleSpec


def decrease(factor: float, spec: ThrottleSpec) -> float:
    """The rate factor after a throttle signal: `factor x decrease_factor`, never below `min_factor`."""
    # Floored: a lane at zero would never send the request that tells us the source is back.
    return max(spec.min_factor, factor * spec.decrease_factor)


def increase(factor: float, spec: ThrottleSpec) -> float:
    """The rate factor after a success: `factor + increase_step`, never above 1 (the configured rate)."""
    # Capped at 1: the configured rate is a promise to the source, not a starting point.
    return min(1.0, factor + spec.increase_step)


def is_throttle_signal(outcome: Outcome, *, timed_out: bool = False) -> bool:
    """Whether a response asks us to slow down: a 429/503 (THROTTLED), or a request that timed out.

    A timeout counts because an overloaded source often stops answering before it starts refusing;
    other failures (blocks, 4xx, connection resets) say nothing about our rate.
    """
    return outcome is Outcome.THROTTLED or timed_out
