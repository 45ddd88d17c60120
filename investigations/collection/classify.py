"""What a response means and what to do next: pure decisions, tested with tables.

`classify` turns a status or an error into an `Outcome`; `next_step` turns an outcome and the
attempt count into done, retry after N seconds, or give up with a reason. No I/O, no clock reads:
time and randomness come in as arguments.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Literal, Protocol

import httpx

from investigations.collection.events import Outcome

if TYPE_CHECKING:  # the specs read the adapters, which read answers with these rules
    from investigations.sources.specs import AnswersSpec, RetrySpec

# A server asking for more than an hour is treated as asking for an hour; the run can't wait longer.
MAX_RETRY_AFTER_S = 3600.0
# Doubling beyond this only overflows; every realistic max_delay_s is reached long before.
_MAX_BACKOFF_EXPONENT = 62

_RETRYABLE = frozenset({Outcome.THROTTLED, Outcome.TRANSIENT, Outcome.BLOCKED})


def classify(status: int | None, error: BaseException | None = None) -> Outcome:
    """The outcome of one attempt from its HTTP status, or from the error that ended it.

    An error wins over a status: a body that timed out after the headers is still a timeout.
    """
    if error is not None:
        # Our own bad request (a scheme httpx can't speak, a malformed request) fails the same way again.
        if isinstance(error, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.InvalidURL):
            return Outcome.PERMANENT
        if isinstance(error, httpx.TransportError | OSError):  # timeouts, refused/reset connections
            return Outcome.TRANSIENT
        return Outcome.PERMANENT
    if status is None:
        return Outcome.PERMANENT
    if 200 <= status < 300:
        return Outcome.OK
    if status in (429, 503):  # both are a server asking us to slow down
        return Outcome.THROTTLED
    if status in (401, 403):  # the identity is refused, not the question
        return Outcome.BLOCKED
    if status == 408 or 500 <= status < 600:
        return Outcome.TRANSIENT
    return Outcome.PERMANENT  # other 4xx, 3xx we did not follow, 1xx and nonsense


def parse_retry_after_s(value: str | None, *, now: datetime) -> float | None:
    """Seconds a `Retry-After` header asks us to wait (delta-seconds or HTTP-date), capped at an hour.

    Never negative (a date in the past means now); None when the header is absent or unreadable.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        delay_s = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        delay_s = (_as_utc(when) - _as_utc(now)).total_seconds()
    if not math.isfinite(delay_s):
        return None
    return min(max(delay_s, 0.0), MAX_RETRY_AFTER_S)


def backoff_delay_s(attempt: int, *, base_delay_s: float, max_delay_s: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff after `attempt` (1-based): uniform in [0, min(max, base * 2^(n-1))].

    Full jitter spreads the retries of many workers that failed together instead of synchronising them.
    """
    exponent = min(max(attempt - 1, 0), _MAX_BACKOFF_EXPONENT)
    return rng.uniform(0, min(max_delay_s, base_delay_s * 2**exponent))


@dataclass(frozen=True)
class Step:
    """What to do after an attempt: finish, retry after `delay_s`, or give up (`reason` says why)."""

    action: Literal["done", "retry", "give_up"]
    delay_s: float
    reason: str


def next_step(
    outcome: Outcome, *, attempt: int, retry: RetrySpec, retry_after_s: float | None, rng: random.Random
) -> Step:
    """Decide after attempt number `attempt` (1-based) ended with `outcome`.

    Retry-After is a floor under the jittered backoff: a server that names a wait gets at least it.
    """
    if outcome is Outcome.OK:
        return Step("done", 0.0, "ok")
    if outcome not in _RETRYABLE:
        return Step("give_up", 0.0, f"{outcome.value}: retrying won't help")
    if attempt >= retry.attempts:
        return Step("give_up", 0.0, f"exhausted {attempt} attempts")
    backoff_s = backoff_delay_s(attempt, base_delay_s=retry.base_delay_s, max_delay_s=retry.max_delay_s, rng=rng)
    delay_s = max(backoff_s, retry_after_s or 0.0)
    return Step("retry", delay_s, f"{outcome.value}: attempt {attempt} of {retry.attempts}, retrying in {delay_s:.2f}s")


def _as_utc(moment: datetime) -> datetime:
    # HTTP-dates with "-0000" and naive clocks carry no zone; both mean UTC here.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


# -- what a source's own answer means ---------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One HTTP answer as a source's rules see it. Header names are lower-case (httpx's)."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Verdict:
    """A source's reading of an answer, where it says more than its status does.

    `empty`: an OK answer that means "nothing here" (not parsed, no records: the outcome `empty`).
    `slow_down`: the source asked us to wait; the fetcher waits `retry_after_s` at least without
    spending a retry attempt, as for a 429. `retry_after_s` alone on an OK answer is a floor on the
    lane's next request (the source's allowance is spent until then).
    """

    outcome: Outcome
    empty: bool = False
    slow_down: bool = False
    retry_after_s: float | None = None
    reason: str | None = None


class AnswerJudge(Protocol):
    """Reads a source's answers by its own rules (an adapter); None leaves the general rules."""

    def judge(self, answer: Answer, *, now: datetime) -> Verdict | None: ...


def judge_answer(answers: AnswersSpec, answer: Answer, *, now: datetime) -> Verdict | None:
    """The verdict of a source's declared rules (`answers:` in its spec) on one answer, or None
    where the general rules (`classify`) already say it all.

    Order: the source's rate-limit headers first (a GitHub 403 with no allowance left is a rate
    limit, not a refusal), then its "nothing here" statuses, then its "slow down" statuses.
    """
    status = answer.status
    header_wait_s = parse_retry_after_s(answer.headers.get("retry-after"), now=now)
    if answers.rate_limit is not None:
        limit = answers.rate_limit
        remaining = _int_header(answer.headers.get(limit.remaining.lower()))
        reset_s = parse_reset_s(answer.headers.get(limit.reset.lower()), limit.reset_format, now=now)
        if status in limit.statuses and (remaining == 0 or header_wait_s is not None):
            wait_s = header_wait_s if header_wait_s is not None else reset_s
            wait_s = wait_s if wait_s is not None else limit.default_wait_s
            return Verdict(Outcome.THROTTLED, slow_down=True, retry_after_s=wait_s,
                           reason=f"HTTP {status}: rate limited, allowance back in {wait_s:.0f} s")
        if 200 <= status < 300 and remaining == 0 and reset_s:
            return Verdict(Outcome.OK, retry_after_s=reset_s)
    if status in answers.empty_statuses:
        return Verdict(Outcome.OK, empty=True)
    if status in answers.slow_down_statuses:
        wait_s = header_wait_s if header_wait_s is not None else answers.slow_down_wait_s
        return Verdict(Outcome.THROTTLED, slow_down=True, retry_after_s=wait_s)
    return None


def parse_reset_s(value: str | None, reset_format: str, *, now: datetime) -> float | None:
    """Seconds until a rate-limit reset header's moment (never negative, capped at an hour), or None.

    `epoch_s`: Unix seconds (GitHub); `iso`: ISO 8601 (Mastodon's `2020-09-08T13:25:00.019685Z`);
    `delta_s`: seconds from now.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        if reset_format == "iso":
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
            delay_s = (_as_utc(when) - _as_utc(now)).total_seconds()
        elif reset_format == "epoch_s":
            delay_s = float(text) - _as_utc(now).timestamp()
        else:
            delay_s = float(text)
    except ValueError:
        return None
    if not math.isfinite(delay_s):
        return None
    return min(max(delay_s, 0.0), MAX_RETRY_AFTER_S)


def _int_header(value: str | None) -> int | None:
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None
