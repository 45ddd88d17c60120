"""The sandbox web, exercised over real loopback HTTP as the fleet will use it."""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from selectolax.lexbor import LexborHTMLParser

from investigations.sandbox import SandboxConfig, start_in_thread
from investigations.sandbox.app import SandboxHandle
from tests.fakes import FakeClock

_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")]
_LEADS = [("domain", "example.com"), ("username", "sample_user"), ("email", "someone@example.org"),
          ("url", "https://example.net/page"), ("org", "Example Widgets Ltd"), ("ip", "203.0.113.7")]


@contextmanager
def sandbox(**config: Any) -> Iterator[tuple[httpx.Client, SandboxHandle]]:
    handle = start_in_thread(SandboxConfig(**config))
    try:
        with httpx.Client(base_url=handle.url, trust_env=False, timeout=5.0) as client:
            yield client, handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with sandbox() as (client, _):
        yield client


def lookup(client: httpx.Client, source: str, kind: str, q: str) -> httpx.Response:
    path = {"robust": "/robust/api/lookup", "fragile": "/fragile/api/search", "quiet": "/quiet/api/lookup"}
    return client.get(path[source], params={"kind": kind, "q": q})


def test_healthz_answers_ok(client: httpx.Client) -> None:
    response = client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_same_request_returns_identical_bytes_and_other_leads_differ(client: httpx.Client) -> None:
    first = lookup(client, "robust", "domain", "example.com")
    again = lookup(client, "robust", "domain", "example.com")
    other = lookup(client, "robust", "domain", "example.org")
    assert first.content == again.content
    assert {r["id"] for r in first.json()["results"]}.isdisjoint(r["id"] for r in other.json()["results"])


def test_two_sources_give_different_records_for_one_lead(client: httpx.Client) -> None:
    robust = lookup(client, "robust", "username", "sample_user").json()["results"]
    fragile = lookup(client, "fragile", "username", "sample_user").json()["results"]
    assert {r["id"] for r in robust}.isdisjoint(r["id"] for r in fragile)


@pytest.mark.parametrize(("kind", "q"), _LEADS)
def test_records_have_the_contract_shape_and_only_reserved_data(
    client: httpx.Client, kind: str, q: str
) -> None:
    body = lookup(client, "robust", kind, q).json()
    assert body["query"] == {"kind": kind, "q": q}
    assert 3 <= len(body["results"]) <= 8
    for record in body["results"]:
        assert set(record) == {"id", "type", "value", "first_seen", "source_url"}
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["first_seen"])
        assert record["source_url"].startswith("https://")
        if record["type"] in ("dns_a", "resolved_ip"):
            assert any(ipaddress.ip_address(record["value"]) in net for net in _DOC_NETS)


def test_fragile_answers_429_with_retry_after_over_its_burst_and_recovers() -> None:
    clock = FakeClock(1000.0)  # moved by hand, so the token bucket is exact
    with sandbox(fragile_rate_per_s=2.0, fragile_burst=2, clock=clock) as (client, _):
        statuses = [lookup(client, "fragile", "domain", "example.com").status_code for _ in range(2)]
        refused = lookup(client, "fragile", "domain", "example.com")
        assert (statuses, refused.status_code, refused.headers["Retry-After"]) == ([200, 200], 429, "1")
        assert "error" in refused.json()

        clock.now += 0.5  # exactly one token at 2 per second
        assert lookup(client, "fragile", "domain", "example.com").status_code == 200
        assert lookup(client, "fragile", "domain", "example.com").status_code == 429

        assert client.post("/_control/fragile", json={"rate_per_s": 0.25}).status_code == 200
        assert lookup(client, "fragile", "domain", "example.com").headers["Retry-After"] == "4"
        clock.now += 4.0
        assert lookup(client, "fragile", "domain", "example.com").status_code == 200
        assert client.get("/_control").json()["sources"]["fragile"]["status_counts"] == {"200": 4, "429": 3}


def test_flaky_error_share_is_near_its_rate_and_repeats_for_the_same_seed() -> None:
    runs = []
    for _ in range(2):
        with sandbox(seed=11, flaky_error_rate=0.2, flaky_stall_rate=0.0) as (client, _):
            statuses = [client.get("/flaky/profile/username/sample_user").status_code for _ in range(200)]
            counts = client.get("/_control").json()["sources"]["flaky"]["status_counts"]
        assert set(statuses) <= {200, 500, 503}
        assert counts == {str(s): statuses.count(s) for s in sorted(set(statuses))}
        runs.append(statuses)
    error_share = sum(s != 200 for s in runs[0]) / len(runs[0])
    assert 0.12 <= error_share <= 0.28
    assert runs[0] == runs[1]


def test_flaky_stall_waits_then_answers_normally() -> None:
    with sandbox(flaky_error_rate=0.0, flaky_stall_rate=1.0, flaky_stall_s=0.2) as (client, _):
        started_s = time.monotonic()
        response = client.get("/flaky/profile/domain/example.com")
        assert time.monotonic() - started_s >= 0.2
        assert response.status_code == 200
        assert client.get("/_control").json()["sources"]["flaky"]["stalls"] == 1


def test_quiet_is_silently_empty_until_switched_off() -> None:
    with sandbox() as (client, handle):
        empty = lookup(client, "quiet", "domain", "example.com")
        assert (empty.status_code, empty.json()["results"]) == (200, [])

        assert client.post("/_control/quiet", json={"empty": False}).json()["empty"] is False
        assert len(lookup(client, "quiet", "domain", "example.com").json()["results"]) >= 3

        handle.app_state.configure("quiet", {"empty": True})  # tests may also flip the state directly
        assert lookup(client, "quiet", "domain", "example.com").json()["results"] == []


def test_slow_delay_stays_within_its_bounds() -> None:
    with sandbox(slow_delay_s=(0.05, 0.15)) as (client, _):
        for _ in range(3):
            started_s = time.monotonic()
            assert client.get("/slow/profile/username/sample_user").status_code == 200
            assert 0.05 <= time.monotonic() - started_s < 0.15 + 0.25  # slack for a loaded machine


def test_html_profile_page_has_the_selectors_the_adapter_uses() -> None:
    q = 'odd<b>&"name'
    with sandbox(flaky_error_rate=0.0, flaky_stall_rate=0.0) as (calm, _):
        response = calm.get("/flaky/profile/org/" + "odd%3Cb%3E%26%22name")
        again = calm.get("/flaky/profile/org/" + "odd%3Cb%3E%26%22name")
    assert response.status_code == 200 and response.content == again.content
    page = LexborHTMLParser(response.text)
    profile = page.css_first("div.profile")
    assert profile.attributes["data-kind"] == "org"
    assert page.css_first("h1.name").text() == q  # escaped on the wire, intact once parsed
    posts = page.css("ul.posts li.post")
    assert 2 <= len(posts) <= 6
    for post in posts:
        assert post.attributes["data-id"]
        assert post.css_first("a.title").attributes["href"].startswith("/")
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", post.css_first("time").attributes["datetime"])
        assert post.css_first("p.body").text()


@pytest.mark.parametrize(
    "path",
    [
        "/robust/api/lookup?q=example.com",
        "/robust/api/lookup?kind=planet&q=mars",
        "/fragile/api/search?kind=domain&q=",
        "/quiet/api/lookup?kind=domain&q=%20",
        "/slow/profile/planet/mars",
        "/flaky/profile/domain/",
    ],
)
def test_bad_lead_is_400_with_a_reason(client: httpx.Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 400
    assert response.json()["error"]


@pytest.mark.parametrize(
    ("source", "body", "status"),
    [
        ("quiet", {"empty": False, "bogus": 1}, 400),
        ("quiet", {"empty": "no"}, 400),
        ("flaky", {"error_rate": 1.5}, 400),
        ("flaky", {"error_rate": 0.7, "stall_rate": 0.7}, 400),
        ("fragile", {"burst": 0}, 400),
        ("fragile", {"rate_per_s": -1}, 400),
        ("slow", {"delay_s": [2, 1]}, 400),
        ("slow", [1, 2], 400),
        ("nowhere", {"empty": True}, 404),
    ],
)
def test_control_rejects_bad_settings_and_changes_nothing(
    client: httpx.Client, source: str, body: Any, status: int
) -> None:
    def settings() -> dict[str, Any]:
        counters = ("requests", "status_counts", "stalls")
        sources = client.get("/_control").json()["sources"]
        return {name: {k: v for k, v in s.items() if k not in counters} for name, s in sources.items()}

    before = settings()
    response = client.post(f"/_control/{source}", json=body)
    assert (response.status_code, bool(response.json()["error"])) == (status, True)
    assert settings() == before


def test_control_rejects_a_body_that_is_not_json(client: httpx.Client) -> None:
    response = client.post("/_control/quiet", content=b"empty=false")
    assert response.status_code == 400


def test_control_reset_zeroes_counters() -> None:
    with sandbox() as (client, _):
        lookup(client, "robust", "domain", "example.com")
        assert client.get("/_control").json()["sources"]["robust"]["requests"] == 1
        reset = client.post("/_control/reset").json()["sources"]["robust"]
        assert (reset["requests"], reset["status_counts"]) == (0, {})


def test_unknown_source_path_is_404(client: httpx.Client) -> None:
    assert client.get("/nowhere/api/lookup", params={"kind": "domain", "q": "example.com"}).status_code == 404


def test_start_in_thread_listens_on_a_free_port_and_stops() -> None:
    handle = start_in_thread()
    assert handle.port > 0 and handle.url == f"http://127.0.0.1:{handle.port}"
    handle.stop()
    assert not handle.thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{handle.url}/healthz", trust_env=False, timeout=1.0)
