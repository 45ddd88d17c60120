"""One TLS context per process: every identity's client shares it, and it checks certificates."""

from __future__ import annotations

import ssl

import pytest

from investigations.identities.config import IdentitySpec
from investigations.identities.sessions import Sessions
from investigations.net.tls import shared_tls_context


def test_the_shared_context_checks_certificates_and_host_names() -> None:
    context = shared_tls_context()
    assert context is shared_tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_clients_for_many_identities_build_no_tls_context_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    shared_tls_context()  # built once per process, before any client
    built: list[object] = []
    create = ssl.create_default_context

    def counting(*args: object, **kwargs: object) -> ssl.SSLContext:
        built.append(args)
        return create(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    sessions = Sessions(user_agent="test")
    try:
        for n in range(4):
            identity = IdentitySpec(id=f"proxy{n}", proxy_url=f"http://127.0.0.1:{9000 + n}", range=f"r{n}",
                                    tier="datacenter")
            sessions._client_for(identity)
        sessions._client_for(IdentitySpec(id="direct2", range="home", tier="residential"))
    finally:
        sessions.close()
    assert built == []
