"""Connect to what was checked: an httpx transport that resolves a name once and dials a checked address.

httpx (through httpcore) resolves a host when it opens a connection, so a guard that resolved the
name earlier checked one answer and the connection may go to another: a name that answers public
first and loopback second (DNS rebinding) reaches the loopback service. `PinnedTransport` plugs a
network backend into httpcore's connection pool; the backend resolves the host once, checks every
address with the SSRF guard (`netguard.resolve_checked`) and connects to a checked address itself.
The request is unchanged above the socket: the URL, the Host header, the TLS SNI name and the
certificate check stay the name's, and cookies keep matching their domain.

What a request may reach on a private network (its source's origin, an operator's CIDR blocks) is
set per request with `allowance_scope`; without one nothing private is allowed.

Through a forward or SOCKS proxy the proxy resolves the target (httpcore sends it the name), so
the proxy's connection is not pinned here: see docs/design.md, "SSRF guard".
"""

from __future__ import annotations

import contextvars
import ssl
import threading
import typing
from collections.abc import Iterator
from contextlib import contextmanager

import httpcore
import httpx

from investigations.net.guard import (
    NO_ALLOWANCE,
    Resolver,
    TargetAllowance,
    TargetRefused,
    resolve_checked,
    system_resolve,
)

_ALLOWANCE: contextvars.ContextVar[TargetAllowance] = contextvars.ContextVar("target_allowance", default=NO_ALLOWANCE)


@contextmanager
def allowance_scope(allowance: TargetAllowance) -> Iterator[None]:
    """Connections opened inside the block may reach what `allowance` opens, and nothing more."""
    token = _ALLOWANCE.set(allowance)
    try:
        yield
    finally:
        _ALLOWANCE.reset(token)


class PinnedBackend(httpcore.NetworkBackend):
    """httpcore's socket layer with the SSRF guard in front: resolve once, check all, dial a checked one."""

    def __init__(self, *, resolve: Resolver = system_resolve, inner: httpcore.NetworkBackend | None = None) -> None:
        self._resolve = resolve
        self._inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = resolve_checked(host, port, allowance=_ALLOWANCE.get(), resolve=self._resolve)
        except TargetRefused:
            raise  # not an httpcore error: httpx lets it through unchanged, and the fetcher refuses the target
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from None
        failure: Exception | None = None
        for address in addresses:
            try:
                return self._inner.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc  # the next checked address of the same name may answer
        assert failure is not None  # resolve_checked never returns an empty list
        raise failure

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise TargetRefused("a unix socket is not a target")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class PinnedTransport(httpx.BaseTransport):
    """An httpx transport (HTTP/1.1, no proxy) whose connections go through `PinnedBackend`.

    Connections are kept per allowance: a connection opened where one source's allowance let a
    private address through is never reused for a request under another allowance, which would
    have to check (and refuse) that address itself.
    """

    def __init__(
        self,
        *,
        resolve: Resolver = system_resolve,
        verify: ssl.SSLContext | bool = True,
        limits: httpx.Limits | None = None,
        inner: httpcore.NetworkBackend | None = None,
    ) -> None:
        self._resolve, self._verify, self._inner = resolve, verify, inner
        self._limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
        self._pools: dict[TargetAllowance, _PoolTransport] = {}
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        allowance = _ALLOWANCE.get()
        with self._lock:
            pool = self._pools.get(allowance)
            if pool is None:
                pool = self._pools[allowance] = _PoolTransport(
                    resolve=self._resolve, verify=self._verify, limits=self._limits, inner=self._inner)
        return pool.handle_request(request)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


class _PoolTransport(httpx.HTTPTransport):
    """`httpx.HTTPTransport` whose connection pool dials through `PinnedBackend`.

    httpx has no public way to hand its transport a network backend, so the connection pool it
    builds is replaced by httpcore's own `ConnectionPool` with the same settings and the backend.
    """

    def __init__(
        self, *, resolve: Resolver, verify: ssl.SSLContext | bool, limits: httpx.Limits,
        inner: httpcore.NetworkBackend | None,
    ) -> None:
        super().__init__(verify=verify, trust_env=False, limits=limits)
        self._pool.close()  # the pool httpx built holds no connection yet; it is replaced whole
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=PinnedBackend(resolve=resolve, inner=inner),
        )
