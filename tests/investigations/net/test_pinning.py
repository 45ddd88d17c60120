"""The pinned transport: it dials the address it checked, while TLS and Host stay the name's.

A real TLS listener on loopback serves a certificate for the fictional `tls.example` (signed by a
test-only CA kept next to this file); the transport's resolver is the only thing that says where
`tls.example` lives.
"""

from __future__ import annotations

import ipaddress
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from investigations.net.guard import TargetAllowance, TargetRefused
from investigations.net.pinning import PinnedTransport, allowance_scope

TLS = Path(__file__).parent / "tls"
# 127.0.0.3 plays the public address the name resolves to; the allowance lets it through the guard.
PUBLIC_STAND_IN = TargetAllowance.build(networks=[ipaddress.ip_network("127.0.0.3/32")])


class TlsListener:
    def __init__(self) -> None:
        self.sni: list[str | None] = []
        self.hosts: list[str] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep connections alive, as real servers do

            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                listener.hosts.append(self.headers.get("Host", ""))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(TLS / "server.pem", TLS / "server.key")
        context.sni_callback = lambda sock, name, ctx: listener.sni.append(name)  # type: ignore[assignment]
        self.server = ThreadingHTTPServer(("127.0.0.3", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls_listener() -> Iterator[TlsListener]:
    listener = TlsListener()
    yield listener
    listener.close()


def client(resolve: object) -> httpx.Client:
    trusted = ssl.create_default_context(cafile=str(TLS / "ca.pem"))
    return httpx.Client(transport=PinnedTransport(resolve=resolve, verify=trusted), trust_env=False)  # type: ignore[arg-type]


def test_tls_to_a_pinned_address_keeps_the_name_for_sni_host_and_the_certificate(tls_listener: TlsListener) -> None:
    with client(lambda host, port: ["127.0.0.3"]) as http, allowance_scope(PUBLIC_STAND_IN):
        response = http.get(f"https://tls.example:{tls_listener.port}/")
    assert response.status_code == 200
    assert tls_listener.sni == ["tls.example"]
    assert tls_listener.hosts == [f"tls.example:{tls_listener.port}"]


def test_the_certificate_is_checked_against_the_name_not_the_address(tls_listener: TlsListener) -> None:
    with client(lambda host, port: ["127.0.0.3"]) as http, allowance_scope(PUBLIC_STAND_IN):
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|match"):
            http.get(f"https://other.example:{tls_listener.port}/")
    assert tls_listener.hosts == []


def test_without_an_allowance_a_private_answer_is_refused_before_any_connection(tls_listener: TlsListener) -> None:
    with client(lambda host, port: ["127.0.0.3"]) as http, pytest.raises(TargetRefused, match="loopback"):
        http.get(f"https://tls.example:{tls_listener.port}/")
    assert (tls_listener.sni, tls_listener.hosts) == ([], [])


def test_a_name_that_does_not_resolve_is_a_connect_error() -> None:
    def nowhere(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    with client(nowhere) as http, pytest.raises(httpx.ConnectError, match="cannot resolve nowhere.example"):
        http.get("https://nowhere.example/")


def test_the_next_checked_address_is_tried_when_the_first_refuses_the_connection(tls_listener: TlsListener) -> None:
    allowance = TargetAllowance.build(networks=[ipaddress.ip_network("127.0.0.0/24")])
    # 127.0.0.4 has no listener: its connection is refused, and 127.0.0.3 (also checked) answers.
    with client(lambda host, port: ["127.0.0.4", "127.0.0.3"]) as http, allowance_scope(allowance):
        assert http.get(f"https://tls.example:{tls_listener.port}/").status_code == 200


def test_a_connection_an_allowance_opened_is_not_reused_under_another(tls_listener: TlsListener) -> None:
    with client(lambda host, port: ["127.0.0.3"]) as http:
        with allowance_scope(PUBLIC_STAND_IN):
            assert http.get(f"https://tls.example:{tls_listener.port}/").status_code == 200  # kept alive
        with pytest.raises(TargetRefused, match="loopback"):
            http.get(f"https://tls.example:{tls_listener.port}/")  # no allowance: checked again, refused
    assert len(tls_listener.hosts) == 1
