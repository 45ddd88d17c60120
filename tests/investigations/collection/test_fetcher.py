"""Fetcher: the retry loop, the SSRF guard and redaction, against a scripted loopback transport."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from investigations.adapters import PlannedRequest
from investigations.collection.events import FetchEvent, Outcome, RequestTally
from investigations.collection.fetcher import Fetcher, FetchFailed, redact_url
from investigations.sources.specs import SourceSpec

BASE = "http://127.0.0.1:8800"


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[FetchEvent] = []

    def record_fetch(self, event: FetchEvent) -> None:
        self.events.append(event)


class Script:
    """A transport that answers from a list, in order, and remembers every request it was sent."""

    def __init__(self, *answers: httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]) -> None:
        self.answers: Iterator[Any] = iter(answers)
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        answer = next(self.answers)
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer


def make_spec(attempts: int = 3) -> SourceSpec:
    return SourceSpec.model_validate(
        {
            "name": "robust",
            "adapter": "json_api",
            "lead_kinds": ["domain"],
            "request": {"url": BASE + "/robust/api/lookup?q={value}"},
            "retry": {"attempts": attempts, "base_delay_s": 1.0, "max_delay_s": 4.0},
            "timeout_s": 2,
        }
    )


class World:
    def __init__(self, *answers: Any, attempts: int = 3) -> None:
        self.script = Script(*answers)
        self.sink = RecordingSink()
        self.sleeps: list[float] = []
        self.spec = make_spec(attempts)
        self.fetcher = Fetcher(
            sink=self.sink,
            identity_id="dc-1",
            rng=random.Random(42),
            sleep=self.sleeps.append,
            now=lambda: datetime(2024, 5, 1, tzinfo=UTC),
            transport=httpx.MockTransport(self.script),
        )

    def fetch(self, url: str = BASE + "/robust/api/lookup?q=example.com") -> Any:
        with self.fetcher:
            return self.fetcher.fetch(self.spec, PlannedRequest("GET", url, {}), lead_id="domain-1", run_id="run-1")


def test_two_throttles_then_ok_logs_three_events_and_sleeps_twice() -> None:
    world = World(httpx.Response(503), httpx.Response(503), httpx.Response(200, content=b'{"results": []}'))
    result = world.fetch()
    assert (result.status, result.body, result.attempts) == (200, b'{"results": []}', 3)
    assert [e.outcome for e in world.sink.events] == [Outcome.THROTTLED, Outcome.THROTTLED, Outcome.OK]
    assert [e.attempt for e in world.sink.events] == [1, 2, 3]
    assert len(world.sleeps) == 2


def test_the_tally_counts_every_attempt_the_fetch_log_records() -> None:
    world = World(httpx.Response(503, content=b"busy"), httpx.Response(200, content=b'{"results": []}'))
    tally = RequestTally()
    with world.fetcher:
        world.fetcher.fetch(world.spec, PlannedRequest("GET", BASE + "/robust/api/lookup?q=a.com", {}),
                            lead_id="domain-1", run_id="run-1", tally=tally)
    assert tally.per_identity() == {"dc-1": (2, sum(e.bytes for e in world.sink.events))} == {"dc-1": (2, 19)}


def test_a_fetch_that_gives_up_still_counts_what_it_sent() -> None:
    world = World(httpx.Response(500, content=b"x"), httpx.Response(500, content=b"yy"), attempts=2)
    tally = RequestTally()
    with world.fetcher, pytest.raises(FetchFailed):
        world.fetcher.fetch(world.spec, PlannedRequest("GET", BASE + "/robust/api/lookup?q=a.com", {}),
                            lead_id="domain-1", tally=tally)
    assert tally.per_identity() == {"dc-1": (2, 3)}


def test_events_carry_identity_run_status_and_size() -> None:
    world = World(httpx.Response(200, content=b"12345"))
    world.fetch()
    [event] = world.sink.events
    assert (event.source, event.lead_id, event.identity_id, event.run_id) == ("robust", "domain-1", "dc-1", "run-1")
    assert (event.status, event.bytes, event.method, event.error) == (200, 5, "GET", None)


def test_retry_after_sets_a_floor_on_the_sleep() -> None:
    world = World(httpx.Response(429, headers={"Retry-After": "5"}), httpx.Response(200))
    world.fetch()
    assert world.sleeps[0] >= 5


def test_not_found_gives_up_at_once_as_permanent() -> None:
    world = World(httpx.Response(404))
    with pytest.raises(FetchFailed) as failed:
        world.fetch()
    assert (failed.value.reason_group, failed.value.last_status, failed.value.attempts) == ("permanent", 404, 1)
    assert world.sleeps == []


def test_server_errors_on_every_attempt_give_up_as_transient() -> None:
    world = World(*[httpx.Response(500)] * 4, attempts=4)
    with pytest.raises(FetchFailed) as failed:
        world.fetch()
    assert (failed.value.reason_group, failed.value.attempts) == ("transient", 4)
    assert "exhausted 4 attempts" in failed.value.last_error
    assert len(world.sink.events) == 4 and len(world.sleeps) == 3


def test_a_timeout_is_transient_and_retried() -> None:
    world = World(httpx.ReadTimeout("stalled"), httpx.Response(200))
    result = world.fetch()
    assert result.attempts == 2
    assert world.sink.events[0].outcome is Outcome.TRANSIENT
    assert "ReadTimeout" in (world.sink.events[0].error or "")


def test_a_redirect_is_followed_within_one_attempt() -> None:
    world = World(httpx.Response(302, headers={"Location": "/robust/api/v2?q=x"}), httpx.Response(200))
    result = world.fetch()
    assert result.url == BASE + "/robust/api/v2?q=x"
    assert [e.attempt for e in world.sink.events] == [1]


def test_a_redirect_to_a_private_address_is_refused_and_never_sent() -> None:
    world = World(httpx.Response(302, headers={"Location": "http://10.0.0.1/admin"}))
    with pytest.raises(FetchFailed) as failed:
        world.fetch()
    assert failed.value.reason_group == "refused"
    assert [str(r.url) for r in world.script.sent] == [BASE + "/robust/api/lookup?q=example.com"]
    [event] = world.sink.events
    assert (event.outcome, event.status, event.url) == (Outcome.PERMANENT, None, "http://10.0.0.1/admin")


def test_a_private_host_filled_in_from_the_lead_is_refused_before_sending() -> None:
    world = World()
    with pytest.raises(FetchFailed, match="refused"):
        world.fetch("http://169.254.169.254/latest/meta-data")
    assert world.script.sent == []
    assert len(world.sink.events) == 1


def test_a_captcha_page_served_with_200_is_blocked_not_ok() -> None:
    page = b'<html><title>Just a moment</title><div class="g-recaptcha"></div></html>'
    world = World(*[httpx.Response(200, content=page)] * 3)
    with pytest.raises(FetchFailed) as failed:
        world.fetch()
    assert (failed.value.reason_group, failed.value.last_status) == ("blocked", 200)
    assert [e.outcome for e in world.sink.events] == [Outcome.BLOCKED] * 3


def test_secret_query_values_are_masked_in_events() -> None:
    world = World(httpx.Response(500), httpx.Response(200))
    world.fetch(BASE + "/robust/api/lookup?q=example.com&api_key=s3cret&Token=t0k")
    assert {e.url for e in world.sink.events} == {BASE + "/robust/api/lookup?q=example.com&api_key=***&Token=***"}
    assert all("s3cret" not in (e.error or "") for e in world.sink.events)


def test_source_headers_are_not_sent_to_another_origin_after_a_redirect() -> None:
    world = World(httpx.Response(302, headers={"Location": "https://cdn.example.com/r"}), httpx.Response(200))
    with world.fetcher:
        request = PlannedRequest("GET", BASE + "/robust/api/lookup?q=x", {"Authorization": "Bearer s3cret"})
        world.fetcher.fetch(world.spec, request, lead_id="domain-1")
    assert [r.headers.get("authorization") for r in world.script.sent] == ["Bearer s3cret", None]


def test_too_many_redirects_give_up_as_permanent() -> None:
    world = World(*[httpx.Response(302, headers={"Location": "/loop"})] * 6)
    with pytest.raises(FetchFailed) as failed:
        world.fetch()
    assert (failed.value.reason_group, failed.value.attempts) == ("permanent", 1)
    assert "more than 5 redirects" in failed.value.last_error


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://user:pw@api.example/x?q=1", "https://api.example/x?q=1"),
        ("https://api.example/x?access_token=a&sig=b&Password=c&q=d", "https://api.example/x?access_token=***&sig=***&Password=***&q=d"),
        ("https://api.example/x?AUTHORIZATION=z", "https://api.example/x?AUTHORIZATION=***"),
        ("https://api.example/x", "https://api.example/x"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected
