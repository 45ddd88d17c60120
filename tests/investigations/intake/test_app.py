"""The webhook intake over ASGI: signed deliveries in, inbox rows out, everything else refused."""

from __future__ import annotations

import base64
import json
import logging
import shutil
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from investigations.config import ConfigError, Settings
from investigations.intake.app import create_intake_app, parse_delivery, serve, server_config
from investigations.intake.leads import normalize_lead
from investigations.intake.webhooks import sign_headers
from investigations.sources.specs import SourceCatalog, parse_sources
from investigations.store.state import StateStore

SECRET = "whsec_" + base64.b64encode(b"intake-test-secret-0123456789").decode()
SECRET_TEXT = SECRET.removeprefix("whsec_")

CATALOG_YAML = """
sources:
  - name: profiles
    adapter: json_api
    lead_kinds: [domain, username]
    request: {url: "https://profiles.example/api?kind={kind}&q={value}"}
  - name: registry
    adapter: json_api
    lead_kinds: [domain, email, org]
    request: {url: "https://registry.example/api?q={value}"}
"""

GOOD = {
    "case_id": "case-42",
    "leads": [
        {"kind": "domain", "value": "Example.COM."},
        {"kind": "username", "value": "@Sample_User"},
        {"kind": "email", "value": "Someone@Example.org"},
    ],
}


class AsgiClient:
    """Drives the ASGI app in-process through httpx's ASGITransport: no server, no sockets.

    (starlette.testclient deprecates plain httpx in Starlette 1.x, hence this small stand-in.)
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://intake.test") as client:
                return await client.request(method, url, **kwargs)

        return anyio.run(send)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)


@pytest.fixture
def catalog() -> SourceCatalog:
    return parse_sources(CATALOG_YAML, env={})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    yield state
    state.close()


@pytest.fixture
def client(store: StateStore, catalog: SourceCatalog) -> AsgiClient:
    return AsgiClient(
        create_intake_app(store=store, catalog=catalog, secret=SECRET, max_body_bytes=10_000, max_leads=5)
    )


def post(client: AsgiClient, payload: Any, *, secret: str = SECRET, webhook_id: str = "msg_1",
         timestamp: datetime | None = None, raw: bytes | None = None) -> Any:
    body = raw if raw is not None else json.dumps(payload).encode()
    headers = sign_headers(secret, body, webhook_id=webhook_id, timestamp=timestamp)
    return client.post("/v1/leads", content=body, headers={**headers, "content-type": "application/json"})


def rows(store: StateStore) -> list[Any]:
    return store.inbox_after(0, limit=100)


def test_healthz_answers_ok_when_the_store_is_reachable(client: AsgiClient) -> None:
    response = client.get("/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_signed_delivery_of_three_leads_is_stored_normalized(client: AsgiClient, store: StateStore) -> None:
    response = post(client, GOOD)

    assert response.status_code == 202
    stored = rows(store)
    assert [(r.lead.kind, r.lead.value) for r in stored] == [
        ("domain", "example.com"), ("username", "sample_user"), ("email", "someone@example.org"),
    ]
    assert {(r.webhook_id, r.case_id, r.priority_class, r.sources) for r in stored} == {
        ("msg_1", "case-42", "interactive", None)
    }
    body = response.json()
    assert body["accepted"] == [r.lead.id for r in stored] and body["duplicates"] == []
    assert body["leads"][0] == {"lead_id": stored[0].lead.id, "kind": "domain", "value": "example.com"}
    assert (body["webhook_id"], body["case_id"]) == ("msg_1", "case-42")


def test_redelivery_answers_202_with_every_lead_a_duplicate(client: AsgiClient, store: StateStore) -> None:
    first = post(client, GOOD)
    again = post(client, GOOD)

    assert again.status_code == 202
    assert again.json()["accepted"] == []
    assert sorted(again.json()["duplicates"]) == sorted(first.json()["accepted"])
    assert len(rows(store)) == 3


def test_requested_sources_and_priority_are_stored(client: AsgiClient, store: StateStore) -> None:
    payload = {**GOOD, "leads": GOOD["leads"][:2], "sources": ["profiles"], "priority": "backfill"}
    assert post(client, payload).status_code == 202
    assert {(r.sources == ["profiles"], r.priority_class) for r in rows(store)} == {(True, "backfill")}


def forged(client: AsgiClient) -> Any:
    return post(client, GOOD, secret="whsec_" + base64.b64encode(b"not the secret").decode())


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(forged, id="forged signature"),
        pytest.param(
            lambda c: c.post("/v1/leads", content=json.dumps(GOOD).encode()), id="missing headers"
        ),
        pytest.param(
            lambda c: c.post(
                "/v1/leads",
                content=json.dumps(GOOD).encode(),
                headers={"webhook-id": "msg_1", "webhook-timestamp": str(int(datetime.now(UTC).timestamp())),
                         "webhook-signature": "v1,!!!notbase64"},
            ),
            id="garbage signature header",
        ),
        pytest.param(
            lambda c: post(c, GOOD, timestamp=datetime.now(UTC) - timedelta(minutes=10)), id="stale timestamp"
        ),
    ],
)
def test_unverifiable_delivery_is_401_and_stores_nothing(
    client: AsgiClient, store: StateStore, send: Any
) -> None:
    response = send(client)

    assert response.status_code == 401
    assert response.json()["error"].startswith("invalid signature: ")
    assert rows(store) == []


def test_malformed_json_is_400(client: AsgiClient, store: StateStore) -> None:
    response = post(client, None, raw=b'{"case_id": "case-42", "leads": [')
    assert response.status_code == 400
    assert rows(store) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param({"urgent": True}, {"field": "urgent"}, id="unknown key"),
        pytest.param({"sources": ["profiles", "nowhere"]}, {"field": "sources[1]"}, id="unknown source"),
        pytest.param({"priority": "asap"}, {"field": "priority"}, id="unknown priority"),
        pytest.param({"case_id": ""}, {"field": "case_id"}, id="empty case id"),
        pytest.param({"case_id": "c" * 201}, {"field": "case_id"}, id="case id too long"),
        pytest.param({"leads": []}, {"field": "leads"}, id="no leads"),
        pytest.param({"leads": [{"kind": "domain", "value": "example.com"}] * 6}, {"field": "leads"},
                     id="more leads than max_leads"),
        pytest.param({"leads": [{"kind": "phone", "value": "+1 555 0100"}]}, {"index": 0, "kind": "phone"},
                     id="unknown kind"),
        pytest.param({"leads": [{"kind": "url", "value": "https://example.com/"}]},
                     {"index": 0, "kind": "url"},
                     id="kind no source takes"),
        pytest.param({"sources": ["profiles"], "leads": [{"kind": "email", "value": "a@example.com"}]},
                     {"index": 0, "kind": "email"}, id="kind no requested source takes"),
        pytest.param({"leads": [{"kind": "domain", "value": "example.com", "note": "x"}]}, {"index": 0},
                     id="unknown lead key"),
        pytest.param({"leads": [{"kind": "domain", "value": 7}]}, {"index": 0}, id="value not a string"),
    ],
)
def test_invalid_delivery_is_422_naming_the_problem_and_stores_nothing(
    client: AsgiClient, store: StateStore, change: dict[str, Any], problem: dict[str, Any]
) -> None:
    response = post(client, {**GOOD, **change}, webhook_id="msg_bad")

    assert response.status_code == 422
    problems = response.json()["problems"]
    assert len(problems) == 1 and problems[0].items() >= problem.items() and problems[0]["reason"]
    assert rows(store) == []


def test_private_address_leads_are_422_each_named_and_earlier_rows_stay(
    client: AsgiClient, store: StateStore
) -> None:
    assert post(client, GOOD).status_code == 202
    payload = {
        "case_id": "case-43",
        "leads": [
            {"kind": "domain", "value": "example.net"},
            {"kind": "url", "value": "http://127.0.0.1/admin"},
            {"kind": "ip", "value": "10.1.2.3"},
        ],
    }

    response = post(client, payload, webhook_id="msg_2")

    assert response.status_code == 422
    problems = response.json()["problems"]
    assert [(p["index"], p["kind"], p["value"]) for p in problems] == [
        (1, "url", "http://127.0.0.1/admin"), (2, "ip", "10.1.2.3"),
    ]
    assert all("private address" in p["reason"] for p in problems)
    assert [r.webhook_id for r in rows(store)] == ["msg_1"] * 3


def test_every_problem_of_a_delivery_is_listed_at_once(client: AsgiClient, store: StateStore) -> None:
    payload = {
        "case_id": "case-44",
        "urgent": True,
        "sources": ["nowhere"],
        "leads": [{"kind": "phone", "value": "+1 555 0100"}, {"kind": "ip", "value": "10.1.2.3"}],
    }

    problems = post(client, payload).json()["problems"]

    assert [p.get("field", p.get("index")) for p in problems] == ["urgent", "sources[0]", 0, 1]
    assert rows(store) == []


def test_a_body_that_is_not_an_object_is_422(client: AsgiClient) -> None:
    assert post(client, ["case-42"]).status_code == 422


def test_oversized_body_is_413(client: AsgiClient, store: StateStore) -> None:
    payload = {**GOOD, "case_id": "x" * 20_000}
    assert post(client, payload).status_code == 413
    assert rows(store) == []


def test_oversized_chunked_body_without_length_is_413(client: AsgiClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 4096

    response = client.post("/v1/leads", content=chunks(), headers=sign_headers(SECRET, b"{}"))
    assert response.status_code == 413


def test_secret_never_appears_in_responses_or_logs_of_a_forged_delivery(
    client: AsgiClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    response = forged(client)
    bad_json = post(client, None, raw=b"{")
    invalid = post(client, {**GOOD, "urgent": True})

    for text in (response.text, bad_json.text, invalid.text, caplog.text):
        assert SECRET not in text and SECRET_TEXT not in text
    assert "intake-test-secret" not in caplog.text
    assert "v1," not in caplog.text  # the signature header is not logged either
    assert any(r.name == "investigations.intake.app" and "status=401" in r.getMessage() for r in caplog.records)


def test_one_log_line_per_accepted_delivery_with_ids_and_counts(
    client: AsgiClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="investigations.intake.app")
    post(client, GOOD)
    [line] = [r.getMessage() for r in caplog.records if r.name == "investigations.intake.app"]
    assert "'msg_1'" in line and "'case-42'" in line and "accepted=3" in line and "duplicates=0" in line


@pytest.fixture
def broken_store(tmp_path: Path) -> Iterator[StateStore]:
    """A store whose database directory vanished after startup (a lost volume, say)."""
    db_dir = tmp_path / "gone"
    state = StateStore.from_url(f"sqlite:///{db_dir / 'state.db'}")
    state.engine.dispose()
    shutil.rmtree(db_dir)
    yield state
    state.close()


def test_healthz_is_503_when_the_store_is_unreachable(
    broken_store: StateStore, catalog: SourceCatalog
) -> None:
    client = AsgiClient(create_intake_app(store=broken_store, catalog=catalog, secret=SECRET))
    response = client.get("/healthz")
    assert response.status_code == 503


def test_store_failure_is_503_without_the_body_in_the_log(
    broken_store: StateStore, catalog: SourceCatalog, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="investigations.intake.app")
    client = AsgiClient(create_intake_app(store=broken_store, catalog=catalog, secret=SECRET))
    response = post(client, GOOD)

    assert (response.status_code, response.json()) == (503, {"error": "state store unavailable"})
    assert "example.com" not in caplog.text.lower() and "sample_user" not in caplog.text.lower()


def test_parse_delivery_keeps_one_normalized_lead_per_lead_sent(catalog: SourceCatalog) -> None:
    payload = {"case_id": "c", "leads": [{"kind": "domain", "value": "a.example"}] * 2}
    delivery = parse_delivery(payload, catalog=catalog)
    assert delivery.leads == [normalize_lead("domain", "a.example")] * 2


def test_serve_without_a_secret_names_the_variable(tmp_path: Path) -> None:
    settings = Settings.from_env({"INVESTIGATIONS_DATA_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="INVESTIGATIONS_WEBHOOK_SECRET"):
        serve(settings)


OLD_SECRET = "whsec_" + base64.b64encode(b"intake-old-secret-0123456789").decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"intake-new-secret-9876543210").decode()


@pytest.mark.parametrize(
    ("signed_with", "webhook_id"),
    [([OLD_SECRET], "msg_old"), ([NEW_SECRET], "msg_new"), ([NEW_SECRET, OLD_SECRET], "msg_both")],
)
def test_during_rotation_deliveries_signed_old_new_or_both_are_stored(
    store: StateStore, catalog: SourceCatalog, signed_with: list[str], webhook_id: str
) -> None:
    env = {"INVESTIGATIONS_WEBHOOK_SECRET": f"{NEW_SECRET} {OLD_SECRET}"}
    settings = Settings.from_env(env)
    rotating = AsgiClient(create_intake_app(store=store, catalog=catalog, secret=settings.webhook_secrets))
    body = json.dumps(GOOD).encode()
    headers = sign_headers(signed_with, body, webhook_id=webhook_id)
    response = rotating.post("/v1/leads", content=body, headers={**headers, "content-type": "application/json"})
    assert response.status_code == 202
    assert {row.webhook_id for row in rows(store)} == {webhook_id}


def test_after_rotation_a_delivery_signed_with_the_retired_secret_is_401(
    store: StateStore, catalog: SourceCatalog
) -> None:
    settings = Settings.from_env({"INVESTIGATIONS_WEBHOOK_SECRET": NEW_SECRET})
    rotated = AsgiClient(create_intake_app(store=store, catalog=catalog, secret=settings.webhook_secrets))
    assert post(rotated, GOOD, secret=OLD_SECRET).status_code == 401
    assert rows(store) == []


def test_the_first_listed_secret_is_the_one_the_fleet_signs_with() -> None:
    settings = Settings.from_env({"INVESTIGATIONS_WEBHOOK_SECRET": f"{NEW_SECRET} {OLD_SECRET}"})
    assert (settings.webhook_secret, settings.webhook_secrets) == (NEW_SECRET, (NEW_SECRET, OLD_SECRET))


class RealIntake:
    """The intake served by uvicorn with the production settings, on a loopback port, in a thread."""

    def __init__(self, app: Starlette, max_header_bytes: int) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(server_config(app, host="127.0.0.1", port=self.port,
                                                   max_header_bytes=max_header_bytes))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the intake did not start"
            time.sleep(0.01)

    def exchange(self, raw: bytes, *, wait_s: float = 5.0) -> bytes:
        """Send `raw` and return what the server answers before it closes or `wait_s` passes."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait_s) as conn:
            conn.sendall(raw)
            answer = b""
            try:
                while chunk := conn.recv(65536):
                    answer += chunk
            except (TimeoutError, ConnectionResetError):
                pass
            return answer

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def real_intake(store: StateStore, catalog: SourceCatalog) -> Iterator[RealIntake]:
    app = create_intake_app(store=store, catalog=catalog, secret=SECRET, max_header_bytes=2048, body_timeout_s=0.5)
    intake = RealIntake(app, max_header_bytes=2048)
    yield intake
    intake.stop()


def test_a_body_that_stops_halfway_is_408_within_the_body_timeout(real_intake: RealIntake, store: StateStore) -> None:
    body = json.dumps(GOOD).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in sign_headers(SECRET, body).items())
    raw = (f"POST /v1/leads HTTP/1.1\r\nHost: intake\r\nContent-Length: {len(body)}\r\n{head}\r\n").encode()
    started = time.monotonic()
    answer = real_intake.exchange(raw + body[: len(body) // 2])
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < 3  # the 0.5 s deadline, not the client's 5 s patience
    assert rows(store) == []


def test_headers_over_the_cap_are_431(real_intake: RealIntake, store: StateStore) -> None:
    raw = b"POST /v1/leads HTTP/1.1\r\nHost: intake\r\nX-Padding: " + b"a" * 3000 + b"\r\nContent-Length: 2\r\n\r\n{}"
    assert real_intake.exchange(raw).startswith(b"HTTP/1.1 431 ")
    assert rows(store) == []


def test_endless_headers_are_refused_by_the_server_with_400_not_buffered(real_intake: RealIntake) -> None:
    # Headers that never end: the server stops buffering at twice the cap instead of waiting for more.
    raw = b"POST /v1/leads HTTP/1.1\r\nHost: intake\r\n" + b"X-Padding: aaaaaaaaaaaaaaaaaaaa\r\n" * 2000
    assert real_intake.exchange(raw).startswith(b"HTTP/1.1 400 ")


def test_a_delivery_within_the_limits_is_accepted_by_the_real_server(real_intake: RealIntake, store: StateStore) -> None:
    body = json.dumps(GOOD).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in sign_headers(SECRET, body).items())
    raw = (f"POST /v1/leads HTTP/1.1\r\nHost: intake\r\nConnection: close\r\n"
           f"Content-Length: {len(body)}\r\n{head}\r\n").encode()
    assert real_intake.exchange(raw + body).startswith(b"HTTP/1.1 202 ")
    assert len(rows(store)) == 3


def test_metrics_on_the_real_server_has_every_configured_source(
        real_intake: RealIntake, store: StateStore, catalog: SourceCatalog) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from investigations.collection.events import FetchEvent, Outcome

    store.record_fetch(FetchEvent(source="profiles", lead_id="l", identity_id="direct", url="https://p.example/",
                                  method="GET", status=429, outcome=Outcome.THROTTLED, latency_ms=40.0, bytes=10,
                                  attempt=1, at=datetime.now(UTC)))
    answer = httpx.get(f"http://127.0.0.1:{real_intake.port}/metrics", timeout=10)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    families = {family.name: family for family in text_string_to_metric_families(answer.text)}
    for name in ("investigations_source_backlog", "investigations_requests", "investigations_source_health"):
        assert {sample.labels["source"] for sample in families[name].samples} == set(catalog.names), name
    assert families["investigations_requests"].type == "counter"
    health = {(s.labels["source"], s.labels["health"]): s.value for s in families["investigations_source_health"].samples}
    assert health[("profiles", "blocked")] == 1.0 and health[("profiles", "ok")] == 0.0
    assert health[("registry", "idle")] == 1.0
    latency = {s.labels["source"]: s.value for s in families["investigations_request_duration_seconds"].samples
               if s.name.endswith("_count")}
    assert latency == {"profiles": 1.0, "registry": 0.0}


def test_metrics_is_503_when_the_store_is_unreachable(broken_store: StateStore, catalog: SourceCatalog) -> None:
    client = AsgiClient(create_intake_app(store=broken_store, catalog=catalog, secret=SECRET))
    assert client.get("/metrics").status_code == 503
