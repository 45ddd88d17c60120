"""Identity health: the transition table, whom an answer blames, rests, ranges and tiers (pure)."""

from __future__ import annotations

import random

import pytest

from investigations.identities import HealthPolicy, classify_for_identity
from investigations.identities.health import (
    HEALTHY,
    IdentityHealth,
    choose_tier,
    health_event,
    next_health,
    next_tier_state,
    range_should_rest,
    rest_s,
)

POLICY = HealthPolicy(forgive_rests_after_successes=5)
NOW = 10_000.0


class Fixed(random.Random):
    """random() always gives `value`: 0.5 is no jitter, 0 the shortest rest, ~1 the longest."""

    def __init__(self, value: float = 0.5) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def h(state: str = "healthy", score: float = 0.0, rests: int = 0, until: float | None = None,
      flagged: float | None = None, streak: int = 0) -> IdentityHealth:
    return IdentityHealth(state=state, score=score, rests=rests, rest_until_s=until, flagged_at_s=flagged,  # type: ignore[arg-type]
                          successes_in_row=streak)


@pytest.mark.parametrize(
    ("before", "event", "after"),
    [
        # failures add a point, successes repay half, down to zero
        (HEALTHY, "failure", h(score=1.0)),
        (h(score=1.0, streak=3), "failure", h(score=2.0)),
        (h(score=2.0), "success", h(score=1.5, streak=1)),
        (h(score=0.5, streak=1), "success", h(score=0.0, streak=2)),
        # a clean identity (no score, no rest to forgive) stays exactly as it is: nothing to write back
        (h(score=0.0, streak=1), "success", h(score=0.0, streak=1)),
        # the source's own faults change nothing
        (h(score=2.0, streak=1), "none", h(score=2.0, streak=1)),
        # reaching the limit rests it: 300 s for the first rest, score back to 0
        (h(score=2.0), "failure", h("resting", 0.0, 1, NOW + 300.0, NOW)),
        # a hard block rests it at once
        (HEALTHY, "block", h("resting", 0.0, 1, NOW + 300.0, NOW)),
        # each rest doubles: 600, 1200, 2400 ...
        (h(rests=1, score=2.0), "failure", h("resting", 0.0, 2, NOW + 600.0, NOW)),
        (h(rests=3), "block", h("resting", 0.0, 4, NOW + 2400.0, NOW)),
        # ... and after retire_after_rests (4) rests the next trip retires it
        (h(rests=4), "block", h("retired", 3.0, 4, None, NOW)),
        # while resting, late answers neither shorten nor extend the rest
        (h("resting", 0.0, 1, NOW + 5.0, NOW - 295.0), "success", h("resting", 0.0, 1, NOW + 5.0, NOW - 295.0)),
        (h("resting", 0.0, 1, NOW + 5.0, NOW - 295.0), "block", h("resting", 0.0, 1, NOW + 5.0, NOW - 295.0)),
        # once the rest is over it is healthy again, with a clean score
        (h("resting", 0.0, 1, NOW, NOW - 300.0), "success", h("healthy", 0.0, 1, None, NOW - 300.0, 1)),
        (h("resting", 0.0, 1, NOW, NOW - 300.0), "failure", h("healthy", 1.0, 1, None, NOW - 300.0)),
        # retired is for good
        (h("retired", 3.0, 4, None, NOW - 1.0), "success", h("retired", 3.0, 4, None, NOW - 1.0)),
        # a long clean run (here 5) forgives earlier rests
        (h(rests=3, streak=4), "success", h(rests=0, streak=0)),
    ],
)
def test_next_health(before: IdentityHealth, event: str, after: IdentityHealth) -> None:
    assert next_health(before, event, now_s=NOW, policy=POLICY, rng=Fixed()) == after  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rests", "u", "expected_s"),
    [
        (0, 0.5, 300.0),
        (1, 0.5, 600.0),
        (3, 0.5, 2400.0),
        (4, 0.5, 3600.0),  # capped at max_rest_s
        (9, 0.5, 3600.0),
        (0, 0.0, 240.0),  # -20 %
        (0, 1.0, 360.0),  # +20 %
        (5, 1.0, 4320.0),  # the jitter applies on top of the cap, so capped rests still spread
    ],
)
def test_rest_doubles_to_the_cap_with_twenty_percent_jitter(rests: int, u: float, expected_s: float) -> None:
    assert rest_s(rests, HealthPolicy(), Fixed(u)) == pytest.approx(expected_s)


MARKERS = ("g-recaptcha", "Access denied by policy")


@pytest.mark.parametrize(
    ("status", "body", "verdict"),
    [
        (200, b"<html>records</html>", "ok"),
        (404, b"not found", "ok"),  # the site answered the identity: nothing against it
        (401, b"", "identity_fault"),
        (403, b"", "identity_fault"),
        (407, b"", "identity_fault"),  # the proxy refused our credentials
        (429, b"", "identity_fault"),
        (200, b'<div class="g-recaptcha">', "identity_fault"),  # a block page dressed as 200
        (200, "<p>ACCESS DENIED BY POLICY</p>", "identity_fault"),  # markers ignore case
        (503, b'<div class="g-recaptcha">', "identity_fault"),  # the marker wins over the status
        (500, b"", "source_fault"),
        (503, b"", "source_fault"),
        (408, b"", "source_fault"),
        (None, b"", "source_fault"),  # timeout or connection error
    ],
)
def test_classify_for_identity(status: int | None, body: bytes | str, verdict: str) -> None:
    assert classify_for_identity(status, body, MARKERS) == verdict


def test_a_marker_past_the_scanned_head_is_content_not_a_block_page() -> None:
    body = b"x" * 70_000 + b"g-recaptcha"
    assert classify_for_identity(200, body, MARKERS) == "ok"


@pytest.mark.parametrize(
    ("verdict", "status", "event"),
    [
        ("ok", 200, "success"),
        ("ok", 404, "success"),
        ("source_fault", 503, "none"),
        ("source_fault", None, "none"),
        ("identity_fault", 403, "block"),
        ("identity_fault", 407, "block"),
        ("identity_fault", 200, "block"),  # a captcha page
        ("identity_fault", 401, "failure"),
        ("identity_fault", 429, "failure"),
    ],
)
def test_health_event(verdict: str, status: int | None, event: str) -> None:
    assert health_event(verdict, status, POLICY) == event  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flags", "rests"),
    [
        ([], False),
        ([NOW], False),
        ([NOW, NOW - 599.0], True),
        ([NOW, NOW - 601.0], False),  # the other flag is outside the 600 s window
        ([NOW, None, NOW - 10.0], True),
    ],
)
def test_range_should_rest(flags: list[float | None], rests: bool) -> None:
    assert range_should_rest(flags, now_s=NOW, policy=POLICY) is rests


@pytest.mark.parametrize(
    ("current", "healthy", "floor", "chosen"),
    [
        (0, [True, True], 0, 0),  # the cheapest tier while it has a healthy identity
        (0, [False, True], 0, 1),  # escalate once it has none
        (0, [False, False, True], 0, 2),  # skipping a tier with none either
        (1, [True, True], 0, 1),  # stay escalated until the run of successes steps it down
        (1, [True, False], 0, 0),  # the costlier tier is spent too: back to the one that recovered
        (0, [False, False], 0, None),
        (0, [True, True], 1, 1),  # never below the source's minimum tier
    ],
)
def test_choose_tier(current: int, healthy: list[bool], floor: int, chosen: int | None) -> None:
    assert choose_tier(current, healthy, floor=floor) == chosen


@pytest.mark.parametrize(
    ("tier", "streak", "rank", "event", "after"),
    [
        (1, 0, 1, "success", (1, 1)),
        (1, 18, 1, "success", (1, 19)),
        (1, 19, 1, "success", (0, 0)),  # 20 in a row: step down
        (1, 7, 1, "failure", (1, 0)),
        (1, 7, 1, "block", (1, 0)),
        (1, 7, 1, "none", (1, 7)),  # the source's fault says nothing about the tier
        (1, 7, 0, "success", (1, 7)),  # a report from another tier's lease doesn't count
        (0, 0, 0, "success", (0, 0)),  # nothing below the cheapest tier
    ],
)
def test_next_tier_state(tier: int, streak: int, rank: int, event: str, after: tuple[int, int]) -> None:
    assert next_tier_state(tier, streak, identity_rank=rank, event=event, policy=HealthPolicy()) == after  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"error_limit": 0},
        {"base_rest_s": 600.0, "max_rest_s": 300.0},
        {"rest_jitter_ratio": 1.0},
        {"retire_after_rests": 0},
    ],
)
def test_an_impossible_policy_fails_at_construction(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HealthPolicy(**bad)  # type: ignore[arg-type]
