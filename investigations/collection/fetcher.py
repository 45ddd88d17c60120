"""The one door every request of the fleet goes through.

`Fetcher.fetch` sends one planned request with retries: each attempt follows redirects by hand
(every hop checked against the SSRF guard), is logged as exactly one `FetchEvent`, and is judged by
the pure decisions in `classify`. Clock, sleep and randomness are injected so tests are exact.
Direct connections go through the pinned transport (`pinning`): a name is resolved once, every
address checked, and a checked address dialled, so DNS rebinding cannot move a connection inward.
What a source may reach on a private network is its own origin and `request.private_networks`.

A request goes out as an identity. Handed an `IdentitySession` (a lease from the identity pool,
opened by `fetcher.sessions`), the fetcher sends through that identity's own HTTP client (its proxy,
its fingerprint's headers in their order, its cookie jar), paces on the identity's lane at the
source, and tells the session after every attempt what the answer says about the identity
(`classify_for_identity`); the session reports to the pool and raises `IdentityBlocked` when the
identity is sent to rest or the lease is lost, so the caller can switch identity. Without a session
(no identities file) it sends as the one `direct` identity, with no proxy.

The fetcher sends, classifies and records; when an attempt may go and what follows each answer
(retry, wait, park or give up) is the request's `pacing.throttle.RequestPacing`'s to say.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self
from urllib.parse import urljoin, urlsplit

import httpx

from investigations.collection.classify import Answer, AnswerJudge, classify, parse_retry_after_s
from investigations.collection.events import FetchEvent, Outcome, RequestTally
from investigations.identities import CookieStore, IdentityPool, IdentityVerdict, classify_for_identity
from investigations.identities.sessions import IdentitySession, Sessions
from investigations.net.guard import (
    Resolver,
    TargetAllowance,
    TargetRefused,
    resolve_checked,
    system_resolve,
    url_origin,
    url_reason,
)
from investigations.net.pinning import allowance_scope
from investigations.net.redaction import redact, redact_url
from investigations.pacing import RateLanes
from investigations.pacing.throttle import RequestPacing
from investigations.pacing.waiting import LaneWaiter
from investigations.sources.specs import SourceSpec

if TYPE_CHECKING:  # adapters import the fetcher's results; the dependency stays one-way at runtime
    from investigations.adapters.base import PlannedRequest

DEFAULT_USER_AGENT = "investigations-fleet/0.1 (collection fleet; contact via project README)"
DEFAULT_MAX_BODY_BYTES = 10_000_000
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_BAD_LOCATION = "Invalid URL in location header"  # httpx's message when a Location cannot be parsed


class FetchLogSink(Protocol):
    """Where the fetcher writes one event per attempt (the fetch log)."""

    def record_fetch(self, event: FetchEvent) -> None: ...


@dataclass(frozen=True)
class FetchResult:
    """A usable answer. `url` is the final url after redirects, unredacted: don't log it as is."""

    status: int
    body: bytes
    url: str
    attempts: int
    latency_ms: float
    headers: dict[str, str] = field(default_factory=dict)
    # The source's own "nothing here" (see classify.Verdict): an answer with no records to parse.
    empty: bool = False
    # What the answer is evidence of (evidence/captures.py): the last hop's method and headers as sent
    # (unredacted: redact before writing) and who sent it.
    method: str = "GET"
    request_headers: dict[str, str] = field(default_factory=dict)
    identity_id: str = ""


class FetchFailed(Exception):
    """The request was given up: `reason_group` is throttled, transient, blocked, permanent or refused."""

    def __init__(self, reason_group: str, last_status: int | None, attempts: int, last_error: str) -> None:
        super().__init__(f"{reason_group} after {attempts} attempt(s): {last_error}")
        self.reason_group = reason_group
        self.last_status = last_status
        self.attempts = attempts
        self.last_error = last_error


class FetchParked(Exception):
    """The source kept throttling (or its lane stayed full) past `throttle.park_after_s`: the work
    should wait `retry_in_s` and come back, not fail. No retry attempt was spent on 429s."""

    def __init__(self, retry_in_s: float, last_status: int | None, requests: int, reason: str) -> None:
        super().__init__(f"parked for {retry_in_s:.0f} s after {requests} request(s): {reason}")
        self.retry_in_s = retry_in_s
        self.last_status = last_status
        self.requests = requests
        self.reason = reason


@dataclass(frozen=True)
class _Attempt:
    """What one attempt did, before the retry decision."""

    url: str
    status: int | None
    outcome: Outcome
    body: bytes
    headers: dict[str, str]
    latency_ms: float
    error: str | None
    refused: bool = False
    timed_out: bool = False
    proxy_failed: bool = False  # the identity's own proxy could not be reached
    empty: bool = False  # the source's "nothing here"
    slow_down: bool = False  # the source asked us to wait (a 429, or its own way of saying so)
    # How long the answer says to wait: Retry-After, or the source's own headers when they say longer.
    retry_after_s: float | None = None
    method: str = "GET"  # the last hop's, and the headers it was sent with
    request_headers: dict[str, str] = field(default_factory=dict)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Fetcher:
    """Sends planned requests with retries, the SSRF guard and one logged event per attempt.

    A request goes out through the `IdentitySession` it is handed (its client, and where what the
    answer says of the identity goes); without one, as the direct identity. The fetcher's `sessions`
    (over `pool` and `cookies`) hold one HTTP client per identity for the fetcher's life; close them
    with `close()` or use the fetcher as a context manager.
    """

    def __init__(
        self,
        *,
        sink: FetchLogSink,
        identity_id: str = "direct",
        user_agent: str = DEFAULT_USER_AGENT,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = _utc_now,
        transport: httpx.BaseTransport | None = None,
        max_redirects: int = 5,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        lanes: RateLanes | None = None,
        max_lane_wait_s: float = 30.0,
        pool: IdentityPool | None = None,
        cookies: CookieStore | None = None,
        resolve: Resolver = system_resolve,
    ) -> None:
        self._sink = sink
        self._resolve = resolve
        self._lanes = lanes
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._clock = clock
        self._now = now
        self._max_redirects = max_redirects
        self._max_body_bytes = max_body_bytes
        self.sessions = Sessions(pool=pool, cookies=cookies, direct_id=identity_id, user_agent=user_agent,
                                 transport=transport, resolve=resolve)
        # How this process's requests wait for their slots on the shared lanes (pacing.waiting).
        self._waiter = LaneWaiter(lanes, sleep=sleep, clock=clock, max_wait_s=max_lane_wait_s) if lanes is not None else None

    @property
    def lanes(self) -> RateLanes | None:
        """The rate lanes this fetcher paces on (None: unpaced)."""
        return self._lanes

    @property
    def pool(self) -> IdentityPool | None:
        """The identity pool the sessions lease from and report to (None: the direct identity only)."""
        return self.sessions.pool

    def close(self) -> None:
        """Close every HTTP client and its connections."""
        self.sessions.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def fetch(
        self,
        spec: SourceSpec,
        request: PlannedRequest,
        *,
        lead_id: str,
        run_id: str | None = None,
        session: IdentitySession | None = None,
        background: bool = False,
        judge: AnswerJudge | None = None,
        tally: RequestTally | None = None,
    ) -> FetchResult:
        """Send `request` for `lead_id` under `spec`'s timeout and retry policy, as the session's
        identity (the direct one without a session); `background` work (recurring crawls,
        backfills) leaves the lanes' later slots to fresh leads (see `pacing.waiting`). `judge`
        (the source's adapter) reads answers by the source's own rules where its statuses and
        headers say more than HTTP's general ones (classify.Verdict).

        Returns the first OK answer; raises FetchFailed when the policy gives up or the target is
        refused, FetchParked when the source keeps throttling, IdentityBlocked when the identity
        must not send here any more. Every attempt is recorded through the sink, whatever its outcome,
        and counted in `tally` (the collection's own count of what it sent) when one is given.
        """
        session = session or self.sessions.direct()
        pacing = RequestPacing(spec, session.identity_id, waiter=self._waiter, pooled_identity=session.proxied,
                               background=background, rng=self._rng, clock=self._clock)
        while True:
            if (wait := pacing.slot()) is not None:
                raise FetchParked(wait.delay_s, None, 0, wait.reason)
            result = self._attempt(spec, request, session.client, proxied=session.proxied, judge=judge)
            self._record(spec, request, result, lead_id=lead_id, run_id=run_id, identity_id=session.identity_id,
                         attempt=pacing.sent, tally=tally)
            if result.refused:
                raise FetchFailed("refused", result.status, pacing.sent, result.error or "refused")
            step = pacing.after(result.outcome, slow_down=result.slow_down, timed_out=result.timed_out,
                                retry_after_s=result.retry_after_s)
            self._report(spec, session, result, pacing.sent, repeat=step.repeat)
            if step.action == "done":
                assert result.status is not None  # OK always comes with a status
                return FetchResult(result.status, result.body, result.url, pacing.sent, result.latency_ms,
                                   result.headers, empty=result.empty, method=result.method,
                                   request_headers=result.request_headers, identity_id=session.identity_id)
            if step.action == "park":
                raise FetchParked(step.delay_s, result.status, pacing.sent, step.reason)
            if step.action == "give_up":
                error = result.error or f"HTTP {result.status}"
                raise FetchFailed(result.outcome.value, result.status, pacing.sent, f"{error} ({step.reason})")
            self._sleep(step.delay_s)

    def _record(self, spec: SourceSpec, request: PlannedRequest, result: _Attempt, *, lead_id: str,
                run_id: str | None, identity_id: str, attempt: int, tally: RequestTally | None) -> None:
        """Log the attempt as one event of the fetch log (its url redacted), and count it in `tally`."""
        self._sink.record_fetch(
            FetchEvent(
                source=spec.name,
                lead_id=lead_id,
                identity_id=identity_id,
                url=redact_url(result.url),
                method=request.method,
                status=result.status,
                outcome=result.outcome,
                latency_ms=result.latency_ms,
                bytes=len(result.body),
                attempt=attempt,
                at=self._now(),
                run_id=run_id,
                error=result.error,
            )
        )
        if tally is not None:
            tally.add(identity_id, len(result.body))

    def _report(self, spec: SourceSpec, session: IdentitySession, result: _Attempt, sent: int, *,
                repeat: bool = False) -> None:
        """Tell the session what the answer says about its identity (it raises IdentityBlocked when
        the identity may not go on).

        A throttle that `repeat`s one its identity's lane was just cut for (in the lane's hold, see
        `RateLanes.feedback`) is not held against the identity again: it answers a request that left
        before the cut took hold. Counted once per refusal, the opening burst of a source configured
        too fast (several refusals of one address within a second or two, before the cut slowed it)
        sent an identity to rest for five minutes, a third of the pool's rate gone while AIMD had
        already found the limit (`bench.product`, configured 2x too high).
        """
        what = f"HTTP {result.status}" if result.status is not None else (result.error or "no answer")
        # Held against nobody, as a source's own fault is.
        verdict = "source_fault" if repeat and result.slow_down else _identity_verdict(spec, result)
        # A source's own rate limit (a GitHub 403 with no allowance left) weighs on the identity as
        # a 429 does, not as the hard block its status alone would be.
        session.report(spec.name, verdict, status=429 if result.slow_down else result.status,
                       answered=result.status, sent=sent, what=what)

    def _attempt(
        self, spec: SourceSpec, request: PlannedRequest, client: httpx.Client, *, proxied: bool,
        judge: AnswerJudge | None = None,
    ) -> _Attempt:
        """One attempt: the request and its redirects, each hop guarded. Never raises for HTTP trouble."""
        allowance = spec.request.allowance
        origin = url_origin(request.url)
        method, url, headers = request.method, request.url, dict(request.headers)
        started = self._clock()

        def elapsed_ms() -> float:
            return (self._clock() - started) * 1000.0

        error: str | None
        for hop in range(self._max_redirects + 1):
            if reason := self._refusal(url, allowance, proxied=proxied):
                # No status: the refused url was never asked (an earlier hop's 3xx is not its answer).
                error = f"refused {redact_url(url)}: {reason}"
                return _Attempt(url, None, Outcome.PERMANENT, b"", {}, elapsed_ms(), error, refused=True)
            if url_origin(url) != origin:
                # Source headers may carry an API key; they are for the configured origin only.
                headers = {}
            try:
                with allowance_scope(allowance):
                    status, response_headers, body, error, sent_headers = self._send(
                        client, method, url, headers, timeout_s=spec.timeout_s)
            except TargetRefused as exc:
                # The name resolved to an address the guard refuses: nothing was sent. A refused
                # target is permanent (a retry would resolve the same name again), never retried.
                error = f"refused {redact_url(url)}: {exc}"
                return _Attempt(url, None, Outcome.PERMANENT, b"", {}, elapsed_ms(), error, refused=True)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                if isinstance(exc, httpx.RemoteProtocolError) and str(exc).startswith(_BAD_LOCATION):
                    # httpx parses every Location while reading the answer and refuses one it cannot
                    # read (`0177.0.0.1`): a redirect hop that cannot be checked is refused, not retried.
                    error = f"refused a redirect from {redact_url(url)}: its location is not a valid url"
                    return _Attempt(url, None, Outcome.PERMANENT, b"", {}, elapsed_ms(), error, refused=True)
                # Exception messages sometimes quote the url they failed on.
                error = redact(f"{type(exc).__name__}: {exc}")
                timed_out = isinstance(exc, httpx.TimeoutException)
                # Through a forward proxy, failing to connect at all means the proxy is unreachable
                # (the target's failures come back from the proxy as 502/504): the identity's fault.
                proxy_failed = proxied and isinstance(exc, httpx.ConnectError | httpx.ProxyError)
                return _Attempt(url, None, classify(None, exc), b"", {}, elapsed_ms(), error, timed_out=timed_out,
                                proxy_failed=proxy_failed)
            location = response_headers.get("location")
            if status in _REDIRECTS and location:
                if hop == self._max_redirects:
                    error = f"more than {self._max_redirects} redirects"
                    return _Attempt(url, status, Outcome.PERMANENT, body, response_headers, elapsed_ms(), error)
                url = urljoin(url, location)
                if status == 303 or (status in (301, 302) and method == "POST"):
                    method = "GET"  # what browsers do, and what servers sending these expect
                continue
            return self._judged(spec, judge, _Attempt(url, status, Outcome.PERMANENT, body, response_headers,
                                                      elapsed_ms(), error, method=method,
                                                      request_headers=sent_headers))
        raise AssertionError("unreachable: the loop returns on its last hop")

    def _judged(self, spec: SourceSpec, judge: AnswerJudge | None, sent: _Attempt) -> _Attempt:
        """An answer classified: by HTTP's general rules, then by the source's own (`judge`, where its
        statuses and headers say more), a block page caught whatever its status; and how long the
        answer says to wait. `sent` carries the answer and an error only when its body was unusable."""
        status, error = sent.status, sent.error
        assert status is not None  # an answer, not a failure to get one
        outcome = Outcome.PERMANENT if error else classify(status)
        verdict = None
        if judge is not None and not error:
            verdict = judge.judge(Answer(status, sent.headers, sent.body), now=self._now())
        if verdict is not None:
            outcome, error = verdict.outcome, verdict.reason
        if outcome is Outcome.OK and _is_block_page(spec, status, sent.body):
            # A block or challenge page served as an answer: parsing it would store nothing, silently.
            outcome, error, verdict = Outcome.BLOCKED, f"HTTP {status} with a block page", None
        retry_after_s = parse_retry_after_s(sent.headers.get("retry-after"), now=self._now())
        if verdict is not None and verdict.retry_after_s is not None:
            retry_after_s = max(retry_after_s or 0.0, verdict.retry_after_s)
        return replace(sent, outcome=outcome, error=error or _status_error(status, outcome),
                       empty=verdict is not None and verdict.empty,
                       slow_down=verdict.slow_down if verdict is not None else status == 429,
                       retry_after_s=retry_after_s)

    def _refusal(self, url: str, allowance: TargetAllowance, *, proxied: bool) -> str | None:
        """Why `url` must not be fetched, or None. Its literal form is judged here; a direct
        connection's resolved addresses are judged where it is opened (PinnedTransport). Through
        a proxy, which resolves the name itself, the fleet's own resolution is checked as well:
        the best it can do, since the proxy may get another answer."""
        if reason := url_reason(url, allowance):
            return reason
        if not proxied or allowance.allows_origin(url):
            return None
        parts = urlsplit(url)
        try:
            resolve_checked(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
                            allowance=allowance, resolve=self._resolve)
        except TargetRefused as exc:
            return str(exc)
        except OSError:
            return None  # the proxy will say it cannot reach the name
        return None

    def _send(
        self, client: httpx.Client, method: str, url: str, headers: dict[str, str], *, timeout_s: float
    ) -> tuple[int, dict[str, str], bytes, str | None, dict[str, str]]:
        """Status, headers, body (at most max_body_bytes), an error when the body was too large, and
        the headers the request went out with (the client's and the request's own)."""
        with client.stream(method, url, headers=headers, timeout=httpx.Timeout(timeout_s)) as response:
            sent = dict(response.request.headers)
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > self._max_body_bytes:
                    # An endless or huge body must not exhaust memory; the answer is unusable anyway.
                    return (response.status_code, dict(response.headers), b"",
                            f"body larger than {self._max_body_bytes} bytes", sent)
                chunks.append(chunk)
            return response.status_code, dict(response.headers), b"".join(chunks), None, sent


def _identity_verdict(spec: SourceSpec, result: _Attempt) -> IdentityVerdict:
    """Whom an attempt blames: a dead proxy is the identity's fault; otherwise the pure rule decides."""
    if result.proxy_failed:
        return "identity_fault"
    if result.slow_down:
        return classify_for_identity(429)
    if result.outcome is Outcome.TRANSIENT and result.status is not None and 200 <= result.status < 300:
        return "source_fault"  # a source failing inside a 200 (a DNS SERVFAIL) is not the identity's doing
    return classify_for_identity(result.status, result.body, spec.block_markers)


def _is_block_page(spec: SourceSpec, status: int, body: bytes) -> bool:
    return classify_for_identity(status, body, spec.block_markers) == "identity_fault"


def _status_error(status: int, outcome: Outcome) -> str | None:
    return None if outcome is Outcome.OK else f"HTTP {status}"
