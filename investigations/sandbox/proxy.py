"""Small HTTP forward proxies on loopback, one per 127.0.0.x address, for tests and benches.

Each proxy listens on its own loopback address (on Linux the whole 127/8 is local) and opens its
connection to the target FROM that same address, so the target sees one distinct client address
per proxy, as a site sees one exit address per real proxy. That is what lets the sandbox ban an
address, and the fleet's identities be told apart on the wire.

Only what the fleet needs: absolute-form requests (`GET http://host:port/path HTTP/1.1`) to http
targets on loopback, with a Content-Length body or none; no CONNECT, no chunked uploads. Optional
Basic proxy auth (`Proxy-Authorization`), answered 407 when missing or wrong. One request per
connection (`Connection: close` both ways), which keeps the framing trivial and correct.

    with start_proxies(["127.0.0.2", "127.0.0.3"], credentials=("fleet", password)) as proxies:
        proxies[0].url  # http://127.0.0.2:41234
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import ipaddress
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

_MAX_HEAD_BYTES = 65_536
_MAX_BODY_BYTES = 10_000_000
# Headers for this hop only (RFC 9110 7.6.1), and the proxy's own: never passed on.
_HOP_BY_HOP = frozenset(
    {b"proxy-authorization", b"proxy-connection", b"keep-alive", b"te", b"trailer", b"upgrade"}
)
_REALM = "sandbox-proxy"


@dataclass
class ProxyStats:
    """What one proxy did: requests forwarded, refused for auth, and failed upstream."""

    forwarded: int = 0
    auth_refused: int = 0
    upstream_failed: int = 0
    refused: int = 0  # not a request this proxy serves (CONNECT, a non-loopback target, a bad head)


@dataclass
class ForwardProxy:
    """One forward proxy: listens on `host`, connects to targets from `host` too."""

    host: str
    credentials: tuple[str, str] | None = field(default=None, repr=False)
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    port: int = 0
    stats: ProxyStats = field(default_factory=ProxyStats)
    _server: asyncio.Server | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """`http://host:port`, without credentials."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=_MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(self._serve_one(reader, writer), self.read_timeout_s)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away or sent nonsense; nothing to answer to
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head[:-4].split(b"\r\n")
        method, target, _version = request_line.split(b" ", 2)
        headers = [_split_header(line) for line in header_lines]
        if self.credentials is not None and not self._authorized(headers):
            self.stats.auth_refused += 1
            await _reply(writer, 407, "Proxy Authentication Required",
                         [(b"Proxy-Authenticate", f'Basic realm="{_REALM}"'.encode())])
            return
        if method == b"CONNECT":
            self.stats.refused += 1
            await _reply(writer, 501, "Not Implemented", body=b"CONNECT is not supported by this proxy\n")
            return
        parts = urlsplit(target.decode("latin-1"))
        if parts.scheme != "http" or not parts.hostname or not _is_loopback(parts.hostname):
            self.stats.refused += 1
            await _reply(writer, 403, "Forbidden", body=b"only absolute http:// targets on loopback\n")
            return
        length = _content_length(headers)
        if length is None or length > _MAX_BODY_BYTES:
            self.stats.refused += 1
            await _reply(writer, 411, "Length Required", body=b"send a Content-Length body, or none\n")
            return
        body = await reader.readexactly(length) if length else b""
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname, parts.port or 80, local_addr=(self.host, 0),
                                        limit=_MAX_HEAD_BYTES),
                self.connect_timeout_s,
            )
        except (OSError, TimeoutError) as exc:
            self.stats.upstream_failed += 1
            await _reply(writer, 502, "Bad Gateway", body=f"upstream: {type(exc).__name__}\n".encode())
            return
        answered = False
        try:
            up_writer.write(b" ".join((method, path.encode("latin-1"), b"HTTP/1.1")) + b"\r\n"
                            + _forwarded_head(headers) + body)
            await up_writer.drain()
            response_head = await up_reader.readuntil(b"\r\n\r\n")
            status_line, *response_lines = response_head[:-4].split(b"\r\n")
            kept = [(n, v) for n, v in map(_split_header, response_lines)
                    if n.lower() not in _HOP_BY_HOP and n.lower() != b"connection"]
            answered = True
            writer.write(status_line + b"\r\n" + _head(kept + [(b"Connection", b"close")]))
            # The target closes after its answer (we asked it to), so the body is everything until EOF,
            # relayed as is: its Content-Length or chunked framing stays valid for the client.
            while chunk := await up_reader.read(65_536):
                writer.write(chunk)
                await writer.drain()
            self.stats.forwarded += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            self.stats.upstream_failed += 1
            if not answered and not writer.is_closing():
                await _reply(writer, 502, "Bad Gateway", body=f"upstream: {type(exc).__name__}\n".encode())
        finally:
            up_writer.close()

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        assert self.credentials is not None
        user, password = self.credentials
        expected = b"Basic " + base64.b64encode(f"{user}:{password}".encode())
        given = next((v for n, v in headers if n.lower() == b"proxy-authorization"), b"")
        return hmac.compare_digest(given, expected)


def _split_header(line: bytes) -> tuple[bytes, bytes]:
    name, colon, value = line.partition(b":")
    if not colon or not name or name != name.strip():
        raise ValueError("malformed header line")
    return name, value.strip()


def _head(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n"


def _forwarded_head(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The client's headers in their order, minus this hop's, with `Connection: close` in the place
    of its own Connection header (so the order the target sees is the client's)."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in _HOP_BY_HOP:
            continue
        out.append((name, b"close") if lower == b"connection" else (name, value))
    if not any(name.lower() == b"connection" for name, _ in out):
        out.append((b"Connection", b"close"))
    return _head(out)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The request body's length (0 without one); None for what this proxy does not take (chunked)."""
    if any(n.lower() == b"transfer-encoding" for n, _ in headers):
        return None
    values = {v for n, v in headers if n.lower() == b"content-length"}
    if not values:
        return 0
    if len(values) != 1 or not next(iter(values)).isdigit():
        return None
    return int(next(iter(values)))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def _reply(writer: asyncio.StreamWriter, status: int, phrase: str,
                 headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b"") -> None:
    extra = (headers or []) + [(b"Content-Type", b"text/plain"), (b"Content-Length", str(len(body)).encode()),
                               (b"Connection", b"close")]
    writer.write(f"HTTP/1.1 {status} {phrase}\r\n".encode() + _head(extra) + body)
    await writer.drain()


class ProxyGroup:
    """Forward proxies served by one event loop in a daemon thread; `stop()` (or `with`) ends them."""

    def __init__(
        self, proxies: list[ForwardProxy], loop: asyncio.AbstractEventLoop, thread: threading.Thread
    ) -> None:
        self.proxies = proxies
        self._loop = loop
        self._thread = thread

    def __getitem__(self, index: int) -> ForwardProxy:
        return self.proxies[index]

    def __len__(self) -> int:
        return len(self.proxies)

    def stop(self, timeout_s: float = 5.0) -> None:
        if not self._thread.is_alive():
            return

        async def close_all() -> None:
            for proxy in self.proxies:
                await proxy.close()

        try:
            asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def loopback_hosts(count: int, *, first: int = 2) -> list[str]:
    """`count` loopback addresses 127.0.0.<first>, 127.0.0.<first+1>, ... (127.0.0.1 is the sandbox's)."""
    if first < 1 or first + count - 1 > 254:
        raise ValueError(f"127.0.0.{first}..{first + count - 1} is not within 127.0.0.1..254")
    return [f"127.0.0.{first + n}" for n in range(count)]


def start_proxies(hosts: Sequence[str], *, credentials: tuple[str, str] | None = None,
                  timeout_s: float = 10.0) -> ProxyGroup:
    """Start one forward proxy per loopback address in `hosts` (each on a free port), all in one
    background event loop, once every one of them listens."""
    for host in hosts:
        if not _is_loopback(host):
            raise ValueError(f"{host!r} is not a loopback address; the sandbox proxies stay on loopback")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="sandbox-proxies")
    thread.start()
    proxies = [ForwardProxy(host, credentials=credentials) for host in hosts]

    async def start_all() -> None:
        for proxy in proxies:
            await proxy.start()

    group = ProxyGroup(proxies, loop, thread)
    try:
        asyncio.run_coroutine_threadsafe(start_all(), loop).result(timeout_s)
    except BaseException:
        group.stop()
        raise
    return group
