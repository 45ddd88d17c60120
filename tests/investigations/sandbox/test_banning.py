"""The sandbox's banning source: an address that asks too fast, or in too regular a rhythm, is
banned for `ban_s` (403 and a captcha block page). Rules are judged on an injected clock."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from investigations.identities import classify_for_identity
from investigations.sandbox import SandboxConfig, start_in_thread
from investigations.sandbox.behaviour import SandboxState, SourceBehaviour
from tests.fakes import FakeClock

A, B = "127.0.0.2", "127.0.0.3"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


def banning(clock: FakeClock, **changes: Any) -> SourceBehaviour:
    behaviour = SandboxState(SandboxConfig(clock=clock))["banning"]
    if changes:
        behaviour.configure(changes)
    return behaviour


def admitted_at(behaviour: SourceBehaviour, clock: FakeClock, client: str, offsets_s: list[float]) -> list[bool]:
    """Send one request per offset (seconds after the start) from `client`; which got through."""
    start_s = clock.now
    results = []
    for offset_s in offsets_s:
        clock.now = start_s + offset_s
        results.append(behaviour.screen(client) is None)
    return results


def irregular(n: int, *, seed: int, lo_s: float = 1.5, hi_s: float = 4.0) -> list[float]:
    rng = random.Random(seed)
    at, out = 0.0, []
    for _ in range(n):
        out.append(at)
        at += rng.uniform(lo_s, hi_s)
    return out


def test_an_address_within_the_rate_and_without_a_rhythm_is_never_banned(clock: FakeClock) -> None:
    behaviour = banning(clock)
    assert all(admitted_at(behaviour, clock, A, irregular(60, seed=1)))
    assert behaviour.bans == {}


def test_more_requests_in_the_window_than_the_rate_allows_bans_the_address(clock: FakeClock) -> None:
    behaviour = banning(clock)  # 1 r/s over 5 s: a sixth request within 5 s is one too many
    assert admitted_at(behaviour, clock, A, [0.0, 0.4, 1.3, 1.5, 2.6, 2.9]) == [True] * 5 + [False]
    assert (behaviour.bans, behaviour.ban_reasons) == ({A: 1}, {"rate": 1})


def test_a_rigid_rhythm_bans_the_address_even_well_below_the_rate(clock: FakeClock) -> None:
    behaviour = banning(clock)  # one request every 2 s: half the rate, but a metronome
    assert admitted_at(behaviour, clock, A, [2.0 * n for n in range(9)]) == [True] * 8 + [False]
    assert (behaviour.bans, behaviour.ban_reasons) == ({A: 1}, {"rhythm": 1})


def test_a_slightly_irregular_rhythm_is_still_a_rhythm(clock: FakeClock) -> None:
    behaviour = banning(clock)  # gaps of 2 s +/- 5 %: a coefficient of variation near 0.03
    offsets = [0.0]
    for gap_s in [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 2.1, 1.9]:
        offsets.append(offsets[-1] + gap_s)
    assert admitted_at(behaviour, clock, A, offsets)[-1] is False


def test_a_ban_answers_for_ban_s_then_lifts(clock: FakeClock) -> None:
    behaviour = banning(clock, ban_s=30.0)
    behaviour.ban(A)
    assert admitted_at(behaviour, clock, A, [0.0, 29.9, 30.1]) == [False, False, True]


def test_a_ban_touches_only_that_address(clock: FakeClock) -> None:
    behaviour = banning(clock)
    admitted_at(behaviour, clock, A, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert behaviour.banned() == [A]
    assert admitted_at(behaviour, clock, B, [0.0]) == [True]


def test_hammering_in_rhythm_through_a_ban_is_banned_again_as_it_ends(clock: FakeClock) -> None:
    behaviour = banning(clock, ban_s=10.0)
    admitted = admitted_at(behaviour, clock, A, [2.0 * n for n in range(16)])
    assert admitted == [True] * 8 + [False] * 8  # banned at 16 s, banned again at 26 s
    assert behaviour.bans == {A: 2}


def test_disabled_rules_never_ban(clock: FakeClock) -> None:
    behaviour = banning(clock, ban_rate_per_s=None, ban_rhythm_cv=None)
    assert all(admitted_at(behaviour, clock, A, [0.1 * n for n in range(50)]))


def test_refusals_from_a_limiter_in_front_ban_the_address_at_ban_refusals_within_the_window(
    clock: FakeClock,
) -> None:
    behaviour = banning(clock, ban_rate_per_s=None, ban_rhythm_cv=None, ban_refusals=3, ban_window_s=10.0)
    assert behaviour.screen(A, refused=True) is None and behaviour.screen(A, refused=True) is None
    clock.now += 11.0  # the first two have left the window
    assert behaviour.screen(A, refused=True) is None and behaviour.screen(A, refused=True) is None
    assert behaviour.screen(B, refused=True) is None  # another address's refusals are its own
    assert behaviour.screen(A) is None  # an admitted request is no refusal
    assert behaviour.screen(A, refused=True) == behaviour.settings.ban_s
    assert (behaviour.bans, dict(behaviour.ban_reasons)) == ({A: 1}, {"refusals": 1})


def test_refusals_ban_nobody_while_the_rule_is_off(clock: FakeClock) -> None:
    behaviour = banning(clock, ban_rate_per_s=None, ban_rhythm_cv=None)
    assert all(behaviour.screen(A, refused=True) is None for _ in range(20))


def test_reset_forgets_bans_and_arrivals(clock: FakeClock) -> None:
    behaviour = banning(clock)
    behaviour.ban(A)
    behaviour.reset()
    assert (behaviour.bans, behaviour.banned(), admitted_at(behaviour, clock, A, [0.0])) == ({}, [], [True])


@pytest.mark.parametrize("changes", [{"ban_rhythm_gaps": 1}, {"ban_s": 0}, {"ban_window_s": -1},
                                     {"ban_rhythm_cv": "low"}, {"visitor_cookie": 1}, {"ban_refusals": 0},
                                     {"ban_refusals": True}])
def test_bad_ban_settings_are_refused(clock: FakeClock, changes: dict[str, Any]) -> None:
    behaviour = banning(clock)
    with pytest.raises(ValueError):
        behaviour.configure(changes)


# -- over HTTP ----------------------------------------------------------------------------------


@pytest.fixture
def web(clock: FakeClock) -> Iterator[httpx.Client]:
    handle = start_in_thread(SandboxConfig(clock=clock))
    try:
        with httpx.Client(base_url=handle.url, trust_env=False, timeout=5.0) as client:
            yield client
    finally:
        handle.stop()


def test_a_banned_address_gets_403_and_a_captcha_block_page(web: httpx.Client, clock: FakeClock) -> None:
    statuses = [web.get("/banning/profile/username/sample_user").status_code for _ in range(6)]
    refused = web.get("/banning/profile/username/sample_user")
    assert statuses == [200] * 5 + [403]  # six at one instant: over 1 r/s x 5 s
    assert refused.status_code == 403 and "Access denied - unusual traffic" in refused.text
    assert classify_for_identity(refused.status_code, refused.content) == "identity_fault"
    assert classify_for_identity(200, refused.content) == "identity_fault"  # the page alone gives it away


def test_control_shows_bans_per_address_and_sets_ban_s(web: httpx.Client, clock: FakeClock) -> None:
    assert web.post("/_control/banning", json={"ban_s": 5}).json()["ban_s"] == 5
    for _ in range(6):
        web.get("/banning/profile/domain/example.com")
    state = web.get("/_control").json()["sources"]["banning"]
    assert (state["bans"], state["banned_now"], state["clients"]) == ({"127.0.0.1": 1}, ["127.0.0.1"], {"127.0.0.1": 6})
    clock.now += 5.1
    assert web.get("/banning/profile/domain/example.com").status_code == 200


def test_a_request_a_limiter_refused_is_answered_429_and_counted_against_the_forwarded_address(
    web: httpx.Client,
) -> None:
    web.post("/_control/robust", json={"ban_refusals": 2})
    # As nginx passes a refusal on: the client's address in X-Forwarded-For, the refusal in a header.
    passed_on = {"X-Forwarded-For": "127.0.0.9", "X-Limiter-Refused": "1"}
    first = web.get("/robust/api/lookup", params={"kind": "domain", "q": "example.com"}, headers=passed_on)
    second = web.get("/robust/api/lookup", params={"kind": "domain", "q": "example.com"}, headers=passed_on)
    mine = web.get("/robust/api/lookup", params={"kind": "domain", "q": "example.com"})
    state = web.get("/_control").json()["sources"]["robust"]
    assert (first.status_code, second.status_code, mine.status_code) == (429, 403, 200)
    assert (state["bans"], state["ban_reasons"]) == ({"127.0.0.9": 1}, {"refusals": 1})


def test_a_visitor_cookie_is_handed_out_once_and_counted_when_it_comes_back(web: httpx.Client) -> None:
    first = web.get("/banning/profile/domain/example.com")
    web.get("/banning/profile/domain/example.com")
    assert first.cookies.get("visitor")
    assert web.get("/_control").json()["sources"]["banning"]["returning_visitors"] == 1
