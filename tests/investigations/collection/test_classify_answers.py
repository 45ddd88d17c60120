"""A source's own rules on its answers (`answers:`): empty and slow-down statuses, rate-limit headers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from investigations.collection.classify import Answer, Verdict, judge_answer, parse_reset_s
from investigations.collection.events import Outcome
from investigations.sources.specs import AnswersSpec, RateLimitHeadersSpec

NOW = datetime(2026, 12, 3, 19, 0, tzinfo=UTC)
EPOCH_NOW = int(NOW.timestamp())
GITHUB = AnswersSpec(empty_statuses=(404,), rate_limit=RateLimitHeadersSpec(statuses=(403, 429)))
MASTODON = AnswersSpec(empty_statuses=(404,), rate_limit=RateLimitHeadersSpec(reset_format="iso", statuses=(429,),
                                                                             default_wait_s=300))
COMMONCRAWL = AnswersSpec(empty_statuses=(404,), slow_down_statuses=(429, 503))


def judge(answers: AnswersSpec, status: int, **headers: str) -> Verdict | None:
    return judge_answer(answers, Answer(status, {k.replace("_", "-"): v for k, v in headers.items()}, b""), now=NOW)


@pytest.mark.parametrize(
    ("answers", "status", "headers", "expected"),
    [
        # the general rules stand where the source says nothing more
        (AnswersSpec(), 200, {}, None),
        (AnswersSpec(), 404, {}, None),
        (AnswersSpec(), 503, {}, None),
        (AnswersSpec(), 429, {}, Verdict(Outcome.THROTTLED, slow_down=True)),
        (AnswersSpec(), 429, {"retry_after": "7"}, Verdict(Outcome.THROTTLED, slow_down=True, retry_after_s=7.0)),
        # "nothing here" is an empty answer, not a failure
        (GITHUB, 404, {}, Verdict(Outcome.OK, empty=True)),
        (COMMONCRAWL, 404, {}, Verdict(Outcome.OK, empty=True)),
        # Common Crawl's 503 is "slow down", waited for like a 429
        (COMMONCRAWL, 503, {}, Verdict(Outcome.THROTTLED, slow_down=True)),
        # a source whose slow-down names no wait gets its declared least wait; its Retry-After wins
        (AnswersSpec(slow_down_wait_s=60), 429, {}, Verdict(Outcome.THROTTLED, slow_down=True, retry_after_s=60.0)),
        (AnswersSpec(slow_down_wait_s=60), 429, {"retry_after": "5"},
         Verdict(Outcome.THROTTLED, slow_down=True, retry_after_s=5.0)),
        # GitHub: a 403 with no allowance left waits for the reset; with retry-after, for that
        (GITHUB, 403, {"x_ratelimit_remaining": "0", "x_ratelimit_reset": str(EPOCH_NOW + 600)}, 600.0),
        (GITHUB, 429, {"x_ratelimit_remaining": "0", "x_ratelimit_reset": str(EPOCH_NOW + 30)}, 30.0),
        (GITHUB, 403, {"x_ratelimit_remaining": "12", "retry_after": "90"}, 90.0),
        (GITHUB, 403, {"x_ratelimit_remaining": "0"}, 60.0),  # no reset given: GitHub says wait a minute
        # GitHub: a 403 with allowance left and no retry-after is a refusal (the general rule: blocked)
        (GITHUB, 403, {"x_ratelimit_remaining": "12"}, None),
        # a success that spent the allowance floors the lane until the reset
        (GITHUB, 200, {"x_ratelimit_remaining": "0", "x_ratelimit_reset": str(EPOCH_NOW + 100)},
         Verdict(Outcome.OK, retry_after_s=100.0)),
        (GITHUB, 200, {"x_ratelimit_remaining": "5", "x_ratelimit_reset": str(EPOCH_NOW + 100)}, None),
        # Mastodon's reset is an ISO timestamp
        (MASTODON, 429, {"x_ratelimit_remaining": "0", "x_ratelimit_reset": "2026-12-03T19:05:00.5Z"}, 300.5),
        (MASTODON, 429, {"x_ratelimit_reset": "not a time"}, Verdict(Outcome.THROTTLED, slow_down=True)),
        (MASTODON, 404, {}, Verdict(Outcome.OK, empty=True)),
    ],
)
def test_judge_answer(answers: AnswersSpec, status: int, headers: dict[str, str], expected: object) -> None:
    verdict = judge(answers, status, **headers)
    if isinstance(expected, float):  # a rate limit: throttled, waited for, no attempt spent
        assert verdict is not None and (verdict.outcome, verdict.slow_down) == (Outcome.THROTTLED, True)
        assert verdict.retry_after_s == pytest.approx(expected)
    else:
        assert verdict == expected


@pytest.mark.parametrize(
    ("value", "reset_format", "expected"),
    [
        (str(EPOCH_NOW + 42), "epoch_s", 42.0),
        (str(EPOCH_NOW - 5), "epoch_s", 0.0),  # already past: now
        (str(EPOCH_NOW + 86400), "epoch_s", 3600.0),  # capped at an hour
        ("2026-12-03T19:00:10.25Z", "iso", 10.25),
        ("2026-12-03T20:00:10+01:00", "iso", 10.0),
        ("15", "delta_s", 15.0),
        ("soon", "epoch_s", None),
        ("", "iso", None),
        (None, "iso", None),
        ("nan", "delta_s", None),
    ],
)
def test_parse_reset_s(value: str | None, reset_format: str, expected: float | None) -> None:
    assert parse_reset_s(value, reset_format, now=NOW) == (pytest.approx(expected) if expected is not None else None)


def test_a_status_cannot_be_both_empty_and_slow_down() -> None:
    with pytest.raises(ValueError, match="both empty_statuses and slow_down_statuses"):
        AnswersSpec(empty_statuses=(429,))
