"""The SSRF guard against real listeners: a refused target receives nothing, not even a connection.

Every path a lead can steer is tried with every form of an internal address that reaches a
listener on this machine (the tunnelled IPv6 forms, which route nowhere here, are in the guard's
own table test): a lead at the intake, a url a lead fills in, a redirect from a configured source,
and a name that answers one address when checked and another when connected (DNS rebinding). No
transport is mocked: the fetcher sends through its own pinned transport, over loopback.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from investigations.adapters import PlannedRequest, build_adapter
from investigations.collection.fetcher import Fetcher, FetchFailed
from investigations.intake.app import create_intake_app
from investigations.intake.leads import Lead
from investigations.intake.webhooks import sign_headers
from investigations.sources.specs import SourceSpec, parse_sources
from investigations.store import StateStore

from .listeners import Listener, listeners_on_one_port

SECRET = "whsec_c3NyZi1saXN0ZW5lci10ZXN0LXNlY3JldA=="


class Sink:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def record_fetch(self, event: Any) -> None:
        self.events.append(event)


@pytest.fixture
def internal() -> Iterator[tuple[Listener, Listener]]:
    """The internal service the fleet must never reach: on 127.0.0.1 and ::1, one port."""
    v4, v6 = listeners_on_one_port("127.0.0.1", "::1")
    yield v4, v6
    v4.close()
    v6.close()


@pytest.fixture
def source() -> Iterator[Listener]:
    """A configured source on a private origin (like the demo sandbox): 127.0.0.1, its own port."""
    listener = Listener("127.0.0.1")
    yield listener
    listener.close()


def internal_forms(port: int) -> list[str]:
    """Urls of the internal service, in every spelling that reaches it from this machine."""
    return [
        f"http://127.0.0.1:{port}/admin",
        f"http://127.1:{port}/admin",
        f"http://2130706433:{port}/admin",
        f"http://0x7f000001:{port}/admin",
        f"http://0177.0.0.1:{port}/admin",
        f"http://0.0.0.0:{port}/admin",
        f"http://[::ffff:127.0.0.1]:{port}/admin",
        f"http://[::ffff:7f00:1]:{port}/admin",
        f"http://[::1]:{port}/admin",
        f"http://[::]:{port}/admin",
        f"http://localhost:{port}/admin",
        f"http://LocalHost.:{port}/admin",
    ]


FORM_IDS = ["v4", "short", "integer", "hex", "octal", "unspecified", "mapped", "mapped-hex", "v6-loopback",
            "v6-unspecified", "localhost", "localhost-dot"]


def spec_at(base_url: str, **request: Any) -> SourceSpec:
    return SourceSpec.model_validate({
        "name": "guarded", "adapter": "json_api", "lead_kinds": ["domain", "url"],
        "request": {"url": base_url + "/lookup?q={value}", **request},
        "retry": {"attempts": 3, "base_delay_s": 0.01, "max_delay_s": 0.02}, "timeout_s": 2,
    })


def fetcher(**kwargs: Any) -> Fetcher:
    return Fetcher(sink=Sink(), sleep=lambda s: None, rng=random.Random(1), **kwargs)


def assert_refused_once(failed: pytest.ExceptionInfo[FetchFailed]) -> None:
    # A refused target is a permanent failure at once: never retried.
    assert (failed.value.reason_group, failed.value.attempts) == ("refused", 1)


@pytest.mark.parametrize("form", range(12), ids=FORM_IDS)
def test_a_lead_at_the_intake_pointing_at_an_internal_address_is_422_and_reaches_nothing(
    internal: tuple[Listener, Listener], tmp_path: Path, form: int
) -> None:
    url = internal_forms(internal[0].port)[form]
    catalog = parse_sources(
        "sources:\n  - {name: pages, adapter: json_api, lead_kinds: [url], "
        "request: {url: 'https://pages.example/fetch?u={value}'}}\n", env={})
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    app = create_intake_app(store=store, catalog=catalog, secret=SECRET)
    body = json.dumps({"case_id": "case-ssrf", "leads": [{"kind": "url", "value": url}]}).encode()

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://intake") as client:
            return await client.post("/v1/leads", content=body, headers=sign_headers(SECRET, body))

    try:
        response = anyio.run(send)
        assert response.status_code == 422
        assert "private address" in response.json()["problems"][0]["reason"]
        assert store.inbox_after(0, limit=10) == []
    finally:
        store.close()
    assert (internal[0].connections, internal[1].connections) == (0, 0)


@pytest.mark.parametrize("form", range(12), ids=FORM_IDS)
def test_a_url_filled_in_from_a_lead_at_an_internal_address_is_refused_and_reaches_nothing(
    internal: tuple[Listener, Listener], source: Listener, form: int
) -> None:
    url = internal_forms(internal[0].port)[form]
    with fetcher() as fleet, pytest.raises(FetchFailed) as failed:
        fleet.fetch(spec_at(source.url), PlannedRequest("GET", url, {}), lead_id="url-1")
    assert_refused_once(failed)
    assert (internal[0].connections, internal[1].connections, source.connections) == (0, 0, 0)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0.0.0.0",
                                  "localhost", "internal-service", "innocent.example"])
def test_a_template_whose_host_is_the_lead_refuses_an_internal_lead_and_reaches_nothing(
    internal: tuple[Listener, Listener], host: str
) -> None:
    # The lead is built as stored, not through the intake's check: the fetcher must refuse on its own.
    spec = SourceSpec.model_validate({
        "name": "by_host", "adapter": "json_api", "lead_kinds": ["domain"],
        "request": {"url": f"http://{{value}}:{internal[0].port}/.well-known/security.txt"},
        "retry": {"attempts": 3, "base_delay_s": 0.01, "max_delay_s": 0.02},
    })
    [planned] = build_adapter(spec).requests_for(Lead("domain", host))
    with fetcher(resolve=lambda name, port: ["127.0.0.1"]) as fleet, pytest.raises(FetchFailed) as failed:
        fleet.fetch(spec, planned, lead_id="domain-1")
    assert_refused_once(failed)
    assert (internal[0].connections, internal[1].connections) == (0, 0)


@pytest.mark.parametrize("form", range(12), ids=FORM_IDS)
def test_a_redirect_from_a_configured_private_source_to_an_internal_address_is_refused(
    internal: tuple[Listener, Listener], source: Listener, form: int
) -> None:
    # The source's own origin is allowed; another port of its host, in whatever spelling, is not.
    source.redirect_to = internal_forms(internal[0].port)[form]
    with fetcher() as fleet, pytest.raises(FetchFailed) as failed:
        fleet.fetch(spec_at(source.url), PlannedRequest("GET", source.url + "/lookup?q=x", {}), lead_id="d-1")
    assert_refused_once(failed)
    assert source.connections == 1
    assert (internal[0].connections, internal[1].connections) == (0, 0)


def test_the_configured_origin_itself_is_reachable(source: Listener) -> None:
    with fetcher() as fleet:
        result = fleet.fetch(spec_at(source.url), PlannedRequest("GET", source.url + "/lookup?q=x", {}), lead_id="d-1")
    assert result.status == 200 and source.connections == 1


def test_a_redirect_to_a_public_name_that_resolves_to_loopback_is_refused_at_connect(
    internal: tuple[Listener, Listener], source: Listener
) -> None:
    source.redirect_to = f"http://innocent.example:{internal[0].port}/admin"
    with fetcher(resolve=lambda host, port: ["127.0.0.1"]) as fleet, pytest.raises(FetchFailed) as failed:
        fleet.fetch(spec_at(source.url), PlannedRequest("GET", source.url + "/lookup?q=x", {}), lead_id="d-1")
    assert_refused_once(failed)
    assert "innocent.example resolves to a private address (127.0.0.1): loopback" in failed.value.last_error
    assert internal[0].connections == 0


class Rebinding:
    """A resolver for one name that answers `first` on its first call and `later` on every other."""

    def __init__(self, first: list[str], later: list[str]) -> None:
        self.first, self.later, self.calls = first, later, 0

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls += 1
        return self.first if self.calls == 1 else self.later


@pytest.fixture
def rebinding_pair() -> Iterator[tuple[Listener, Listener]]:
    # 127.0.0.3 plays a public address (the source allows it as a CIDR block); 127.0.0.1 is the
    # internal service the name rebinds to. Same port: only the address decides who is reached.
    public, internal_service = listeners_on_one_port("127.0.0.3", "127.0.0.1")
    yield public, internal_service
    public.close()
    internal_service.close()


def test_a_name_that_rebinds_after_the_check_is_connected_to_the_checked_address(
    rebinding_pair: tuple[Listener, Listener],
) -> None:
    public, internal_service = rebinding_pair
    resolver = Rebinding(first=["127.0.0.3"], later=["127.0.0.1"])
    spec = spec_at("https://api.example", private_networks=["127.0.0.3/32"])
    url = f"http://rebind.example:{public.port}/lookup?q=x"
    with fetcher(resolve=resolver) as fleet:
        result = fleet.fetch(spec, PlannedRequest("GET", url, {}), lead_id="d-1")
    assert result.status == 200
    assert resolver.calls == 1  # resolved once: the address checked is the address dialled
    assert internal_service.connections == 0
    assert public.hosts == [f"rebind.example:{public.port}"]  # the Host header is still the name


def test_every_redirect_hop_resolves_and_checks_again(rebinding_pair: tuple[Listener, Listener]) -> None:
    # The first connection goes to the checked address; its redirect to the same name needs a new
    # connection (the listener closes this one), which resolves again, gets the internal answer
    # and is refused.
    public, internal_service = rebinding_pair
    public.redirect_to = f"http://rebind.example:{public.port}/again"
    resolver = Rebinding(first=["127.0.0.3"], later=["127.0.0.1"])
    spec = spec_at("https://api.example", private_networks=["127.0.0.3/32"])
    with fetcher(resolve=resolver) as fleet, pytest.raises(FetchFailed) as failed:
        fleet.fetch(spec, PlannedRequest("GET", f"http://rebind.example:{public.port}/x", {}), lead_id="d-1")
    assert_refused_once(failed)
    assert resolver.calls == 2
    assert (public.connections, internal_service.connections) == (1, 0)


def test_a_name_with_one_internal_answer_among_allowed_ones_reaches_nothing(
    rebinding_pair: tuple[Listener, Listener],
) -> None:
    public, internal_service = rebinding_pair
    spec = spec_at("https://api.example", private_networks=["127.0.0.3/32"])
    with fetcher(resolve=lambda host, port: ["127.0.0.3", "127.0.0.1"]) as fleet, pytest.raises(FetchFailed) as failed:
        fleet.fetch(spec, PlannedRequest("GET", f"http://mixed.example:{public.port}/x", {}), lead_id="d-1")
    assert_refused_once(failed)
    assert (public.connections, internal_service.connections) == (0, 0)


def test_an_operator_cidr_block_does_not_open_the_rest_of_the_network(rebinding_pair: tuple[Listener, Listener]) -> None:
    public, internal_service = rebinding_pair
    spec = spec_at("https://api.example", private_networks=["127.0.0.3/32"])
    with fetcher() as fleet, pytest.raises(FetchFailed) as failed:
        fleet.fetch(spec, PlannedRequest("GET", f"http://127.0.0.1:{public.port}/x", {}), lead_id="d-1")
    assert_refused_once(failed)
    assert internal_service.connections == 0
    with fetcher() as fleet:
        assert fleet.fetch(spec, PlannedRequest("GET", f"http://127.0.0.3:{public.port}/x", {}), lead_id="d-1").status == 200
