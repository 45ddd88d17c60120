"""Health of one identity at one source: a tiny state machine, pure and tested with a table.

    healthy --(error score reaches the limit)--> resting --(rest over)--> healthy (score 0)
    healthy --(trips again after `retire_after_rests` rests)--> retired (for good, at that source)

Every identity-fault answer adds `failure_weight` to the score, every success takes
`success_weight` off, a hard block (403, a captcha page) sets it to the limit at once. Faults of the
source (5xx, timeouts) say nothing about the identity and leave it alone. A rest lasts
base_rest_s x 2^rests, capped at max_rest_s, then jittered by ±rest_jitter_ratio so identities
flagged together don't all come back in the same second.

The same jittered cooldown rests a whole range at a source when several of its identities are
flagged there within `range_window_s`, and the tier rules (escalate, step down) live here too, so
the pool only reads, decides with these functions, and writes.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

IdentityVerdict = Literal["ok", "identity_fault", "source_fault"]
HealthEvent = Literal["success", "failure", "block", "none"]
HealthStateName = Literal["healthy", "resting", "retired"]

# Markers of block / challenge pages that answer 200; sources add their own (see classify_for_identity).
DEFAULT_BLOCK_MARKERS: tuple[str, ...] = (
    "g-recaptcha",
    "h-captcha",
    "cf-challenge",
    "challenge-platform",
    "px-captcha",
    "are you a robot",
)
# A block page is recognised by its first bytes; a marker deep in a large record page is content.
BLOCK_MARKER_SCAN_BYTES = 65_536
_MAX_DOUBLINGS = 60  # keeps 2**rests finite; every sane max_rest_s is reached long before


@dataclass(frozen=True)
class HealthPolicy:
    """Thresholds of identity health, each with its reason. Times in seconds."""

    # Rest once the error score reaches this: three plain failures, or one hard block.
    error_limit: float = 3.0
    # A failure costs a full point; a success repays half, so a 1-in-3 failure rate still trips.
    failure_weight: float = 1.0
    success_weight: float = 0.5
    # First rest 5 min, doubling per rest up to an hour: long enough for a site's block to lapse.
    base_rest_s: float = 300.0
    max_rest_s: float = 3600.0
    # ±20 % on every rest so identities flagged together return spread out.
    rest_jitter_ratio: float = 0.2
    # An identity sent to rest this many times is spent at that source: the next trip retires it.
    retire_after_rests: int = 4
    # A long clean run forgives the old rests, so occasional trips over months don't retire it.
    forgive_rests_after_successes: int = 200
    # This many identities of one range flagged at one source within the window rest the range.
    range_flags_to_rest: int = 2
    range_window_s: float = 600.0
    # A range quiet this long since its last rest starts over from base_rest_s.
    range_forgive_after_s: float = 86_400.0
    # An escalated source goes back to the cheaper tier after this many successes in a row.
    step_down_after_successes: int = 20
    # Answers that blame the identity: unauthorized, forbidden, proxy auth refused, throttled.
    identity_fault_statuses: frozenset[int] = field(default_factory=lambda: frozenset({401, 403, 407, 429}))
    # Of those, the ones that are a verdict on the identity rather than a warning: rest at once.
    hard_block_statuses: frozenset[int] = field(default_factory=lambda: frozenset({403, 407}))

    def __post_init__(self) -> None:
        if self.error_limit <= 0 or self.failure_weight <= 0 or self.success_weight < 0:
            raise ValueError("error_limit and failure_weight must be > 0, success_weight >= 0")
        if not 0 < self.base_rest_s <= self.max_rest_s:
            raise ValueError(f"need 0 < base_rest_s ({self.base_rest_s}) <= max_rest_s ({self.max_rest_s})")
        if not 0 <= self.rest_jitter_ratio < 1:
            raise ValueError(f"rest_jitter_ratio ({self.rest_jitter_ratio}) must be in [0, 1)")
        if self.retire_after_rests < 1 or self.range_flags_to_rest < 1 or self.step_down_after_successes < 1:
            raise ValueError("retire_after_rests, range_flags_to_rest and step_down_after_successes must be >= 1")


DEFAULT_POLICY = HealthPolicy()


@dataclass(frozen=True)
class IdentityHealth:
    """One row of `identity_health`: the identity's standing at one source."""

    state: HealthStateName
    score: float
    rests: int  # rests so far (forgiven after a long clean run)
    rest_until_s: float | None
    flagged_at_s: float | None  # last time it was sent to rest or retired
    successes_in_row: int


HEALTHY = IdentityHealth(state="healthy", score=0.0, rests=0, rest_until_s=None, flagged_at_s=None,
                         successes_in_row=0)


def classify_for_identity(
    status: int | None, body: bytes | str = b"", markers: Sequence[str] = DEFAULT_BLOCK_MARKERS, *,
    policy: HealthPolicy = DEFAULT_POLICY,
) -> IdentityVerdict:
    """Whom an answer blames: the identity (401/403/407/429, a block page), the source (5xx, 408, no
    answer at all), or nobody ("ok": any other answer, a 404 included, shows the identity got through).

    A block-page marker wins over the status: a captcha served with 200 is still a block.
    """
    if markers and body and _has_marker(body, markers):
        return "identity_fault"
    if status is None or status == 408 or 500 <= status < 600:
        return "source_fault"
    if status in policy.identity_fault_statuses:
        return "identity_fault"
    return "ok"


def _has_marker(body: bytes | str, markers: Sequence[str]) -> bool:
    head = body[:BLOCK_MARKER_SCAN_BYTES]
    text = (head.decode("utf-8", "replace") if isinstance(head, bytes) else head).lower()
    return any(marker.lower() in text for marker in markers)


def health_event(verdict: IdentityVerdict, status: int | None, policy: HealthPolicy = DEFAULT_POLICY) -> HealthEvent:
    """The event a verdict is for the identity: a hard block (403/407, a block page), a failure, a
    success, or nothing (the source's own fault)."""
    if verdict == "ok":
        return "success"
    if verdict == "source_fault":
        return "none"
    if status in policy.hard_block_statuses or status is None or 200 <= status < 400:
        return "block"  # a refusal, or a block page dressed as an answer
    return "failure"


def rest_s(rests: int, policy: HealthPolicy, rng: random.Random) -> float:
    """The rest after `rests` earlier rests: base x 2^rests capped at max, then ±jitter."""
    plain = min(policy.max_rest_s, policy.base_rest_s * 2.0 ** min(rests, _MAX_DOUBLINGS))
    return plain * (1.0 + policy.rest_jitter_ratio * (2.0 * rng.random() - 1.0))


def is_available(health: IdentityHealth | None, now_s: float) -> bool:
    """May the identity be leased for the source now? Healthy, or its rest is over."""
    if health is None or health.state == "healthy":
        return True
    return health.state == "resting" and health.rest_until_s is not None and now_s >= health.rest_until_s


def next_health(
    health: IdentityHealth, event: HealthEvent, *, now_s: float, policy: HealthPolicy, rng: random.Random
) -> IdentityHealth:
    """The identity's health at a source after `event` at `now_s`."""
    if health.state == "retired":
        return health
    if health.state == "resting":
        if not is_available(health, now_s):
            # Late answers to requests sent before the rest: they neither shorten nor lengthen it.
            return health
        health = replace(health, state="healthy", score=0.0, rest_until_s=None, successes_in_row=0)
    match event:
        case "success":
            if health.score == 0 and health.rests == 0:
                # Nothing to repay and no rest to forgive: a clean identity stays as it is, and the
                # pool need not write it back (every answer reports, and the state store's writes
                # queue behind one writer on SQLite).
                return health
            streak = health.successes_in_row + 1
            rests = health.rests
            if streak >= policy.forgive_rests_after_successes:
                rests, streak = 0, 0
            return replace(health, score=max(0.0, health.score - policy.success_weight), successes_in_row=streak,
                           rests=rests)
        case "failure":
            score = health.score + policy.failure_weight
        case "block":
            score = max(health.score, policy.error_limit)
        case _:
            return health
    if score < policy.error_limit:
        return replace(health, score=score, successes_in_row=0)
    if health.rests >= policy.retire_after_rests:
        return IdentityHealth(state="retired", score=score, rests=health.rests, rest_until_s=None,
                              flagged_at_s=now_s, successes_in_row=0)
    return IdentityHealth(state="resting", score=0.0, rests=health.rests + 1,
                          rest_until_s=now_s + rest_s(health.rests, policy, rng), flagged_at_s=now_s,
                          successes_in_row=0)


def flagged(before: IdentityHealth, after: IdentityHealth) -> bool:
    """Did this transition send the identity to rest or retire it?"""
    return after.flagged_at_s is not None and after.flagged_at_s != before.flagged_at_s


def range_should_rest(flag_times_s: Iterable[float | None], *, now_s: float, policy: HealthPolicy) -> bool:
    """Rest a range at a source when enough of its identities were flagged there within the window."""
    since = now_s - policy.range_window_s
    return sum(1 for t in flag_times_s if t is not None and t >= since) >= policy.range_flags_to_rest


def choose_tier(current: int, healthy_by_tier: Sequence[bool], *, floor: int = 0) -> int | None:
    """The tier to serve a source from, given which tiers have a healthy identity there.

    Stay while the current tier (never below `floor`) has one; else climb to the next costlier tier
    that has one; only when none above is healthy either fall back to the cheapest healthy tier below.
    None when no tier has a healthy identity.
    """
    start = max(current, floor)
    for rank in range(start, len(healthy_by_tier)):
        if healthy_by_tier[rank]:
            return rank
    for rank in range(floor, min(start, len(healthy_by_tier))):
        if healthy_by_tier[rank]:
            return rank
    return None


def next_tier_state(
    tier_index: int, successes_in_row: int, *, identity_rank: int, event: HealthEvent, floor: int = 0,
    policy: HealthPolicy,
) -> tuple[int, int]:
    """(tier, successes in a row) of a source after a report from an identity of rank `identity_rank`.

    Only reports from the tier the source is escalated to count: a run of successes there steps the
    source one tier down (cheaper), any identity fault restarts the run. Reports from another tier
    (a lease taken before the tier moved) and source faults change nothing.
    """
    if identity_rank != tier_index or tier_index <= floor or event == "none":
        return tier_index, successes_in_row
    if event != "success":
        return tier_index, 0
    if successes_in_row + 1 >= policy.step_down_after_successes:
        return tier_index - 1, 0
    return tier_index, successes_in_row + 1
