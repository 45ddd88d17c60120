"""Pure decisions: what a response means, how long to wait, and whether to try again."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import httpx
import pytest

from investigations.collection.classify import Step, backoff_delay_s, classify, next_step, parse_retry_after_s
from investigations.collection.events import Outcome
from investigations.sources.specs import RetrySpec

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
REQUEST = httpx.Request("GET", "http://127.0.0.1/")


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, Outcome.OK),
        (204, Outcome.OK),
        (301, Outcome.PERMANENT),
        (304, Outcome.PERMANENT),
        (400, Outcome.PERMANENT),
        (401, Outcome.BLOCKED),
        (403, Outcome.BLOCKED),
        (404, Outcome.PERMANENT),
        (408, Outcome.TRANSIENT),
        (410, Outcome.PERMANENT),
        (429, Outcome.THROTTLED),
        (500, Outcome.TRANSIENT),
        (502, Outcome.TRANSIENT),
        (503, Outcome.THROTTLED),
        (504, Outcome.TRANSIENT),
        (599, Outcome.TRANSIENT),
        (None, Outcome.PERMANENT),
    ],
)
def test_classify_status(status: int | None, expected: Outcome) -> None:
    assert classify(status) is expected


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (httpx.ReadTimeout("slow", request=REQUEST), Outcome.TRANSIENT),
        (httpx.ConnectTimeout("slow", request=REQUEST), Outcome.TRANSIENT),
        (httpx.ConnectError("refused", request=REQUEST), Outcome.TRANSIENT),
        (httpx.RemoteProtocolError("cut", request=REQUEST), Outcome.TRANSIENT),
        (ConnectionResetError(), Outcome.TRANSIENT),
        (httpx.UnsupportedProtocol("ftp", request=REQUEST), Outcome.PERMANENT),
        (httpx.InvalidURL("bad"), Outcome.PERMANENT),
        (ValueError("bug"), Outcome.PERMANENT),
    ],
)
def test_classify_error(error: BaseException, expected: Outcome) -> None:
    assert classify(None, error) is expected


def test_an_error_wins_over_the_status_it_arrived_with() -> None:
    assert classify(200, httpx.ReadTimeout("body stalled", request=REQUEST)) is Outcome.TRANSIENT


@pytest.mark.parametrize(
    ("value", "expected_s"),
    [
        ("5", 5.0),
        (" 2.5 ", 2.5),
        ("0", 0.0),
        ("-3", 0.0),
        ("99999", 3600.0),
        ("Wed, 01 May 2024 12:00:30 GMT", 30.0),
        ("Wed, 01 May 2024 11:00:00 GMT", 0.0),
        ("Wed, 01 May 2024 12:00:10 -0000", 10.0),
        ("Fri, 01 May 2025 12:00:00 GMT", 3600.0),
        (None, None),
        ("", None),
        ("soon", None),
        ("nan", None),
        ("inf", None),
    ],
)
def test_parse_retry_after_s(value: str | None, expected_s: float | None) -> None:
    assert parse_retry_after_s(value, now=NOW) == expected_s


@pytest.mark.parametrize(("attempt", "ceiling_s"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (20, 10.0)])
def test_backoff_stays_within_the_full_jitter_ceiling(attempt: int, ceiling_s: float) -> None:
    rng = random.Random(7)
    delays = [backoff_delay_s(attempt, base_delay_s=1.0, max_delay_s=10.0, rng=rng) for _ in range(200)]
    assert all(0.0 <= d <= ceiling_s for d in delays)
    assert max(delays) > ceiling_s * 0.9  # the jitter uses the whole range, not a corner of it


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    first = [backoff_delay_s(3, base_delay_s=0.5, max_delay_s=10, rng=random.Random(1)) for _ in range(3)]
    second = [backoff_delay_s(3, base_delay_s=0.5, max_delay_s=10, rng=random.Random(1)) for _ in range(3)]
    assert first == second


RETRY = RetrySpec(attempts=3, base_delay_s=1.0, max_delay_s=10.0)


@pytest.mark.parametrize(
    ("outcome", "attempt", "retry_after_s", "action"),
    [
        (Outcome.OK, 1, None, "done"),
        (Outcome.OK, 3, None, "done"),
        (Outcome.PERMANENT, 1, None, "give_up"),
        (Outcome.THROTTLED, 1, None, "retry"),
        (Outcome.TRANSIENT, 2, None, "retry"),
        (Outcome.BLOCKED, 1, None, "retry"),
        (Outcome.THROTTLED, 3, 5.0, "give_up"),
        (Outcome.TRANSIENT, 3, None, "give_up"),
        (Outcome.BLOCKED, 4, None, "give_up"),
    ],
)
def test_next_step_action(outcome: Outcome, attempt: int, retry_after_s: float | None, action: str) -> None:
    step = next_step(outcome, attempt=attempt, retry=RETRY, retry_after_s=retry_after_s, rng=random.Random(0))
    assert step.action == action


def test_next_step_gives_up_saying_how_many_attempts_were_made() -> None:
    step = next_step(Outcome.TRANSIENT, attempt=3, retry=RETRY, retry_after_s=None, rng=random.Random(0))
    assert step == Step("give_up", 0.0, "exhausted 3 attempts")


def test_retry_after_is_a_floor_under_the_backoff() -> None:
    step = next_step(Outcome.THROTTLED, attempt=1, retry=RETRY, retry_after_s=30.0, rng=random.Random(0))
    assert step.delay_s == 30.0


def test_retry_delay_is_the_backoff_when_it_exceeds_retry_after() -> None:
    expected_s = backoff_delay_s(2, base_delay_s=1.0, max_delay_s=10.0, rng=random.Random(3))
    step = next_step(Outcome.TRANSIENT, attempt=2, retry=RETRY, retry_after_s=0.0, rng=random.Random(3))
    assert step.delay_s == expected_s
