"""Recorded answers of the public sources (tests/fixtures/public) and a loopback server that plays them.

A recording is the answer as it comes off the wire: status line, headers, a blank line, the body.
`RecordedWeb` serves each source under its own path prefix on 127.0.0.1, and `env` points
`sources.public.yaml`'s base urls there, so the fleet's own collect path runs against it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx

from investigations.sources.specs import SourceCatalog, load_sources

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "public"
PUBLIC_SOURCES = ROOT / "sources.public.yaml"
# The moment the recordings' rate-limit resets are judged at (their resets are absolute times).
NOW = datetime(2026, 12, 3, 19, 0, tzinfo=UTC)

# Where each source's base url points on the loopback server (path prefix per source).
BASE_VARS = {
    "INVESTIGATIONS_CRTSH_URL": "/crtsh",
    "INVESTIGATIONS_WAYBACK_URL": "/wayback",
    "INVESTIGATIONS_RDAP_BOOTSTRAP_URL": "/rdap/dns.json",
    "INVESTIGATIONS_DOH_URL": "/dns/resolve",
    "INVESTIGATIONS_HN_URL": "/hackernews",
    "INVESTIGATIONS_GITHUB_URL": "/github",
    "INVESTIGATIONS_MASTODON_URL": "/mastodon",
    "INVESTIGATIONS_COMMONCRAWL_URL": "/commoncrawl",
}
# Hosts named inside recorded bodies (a bootstrap file, a collection list), served here too.
HOST_REWRITES = {
    "https://rdap.verisign.com/": "/rdap/",
    "https://index.commoncrawl.org/": "/commoncrawl/",
}


@dataclass(frozen=True)
class Recorded:
    status: int
    headers: dict[str, str]  # names lower-case, as httpx gives them
    body: bytes

    def response(self, *, body: bytes | None = None) -> httpx.Response:
        return httpx.Response(self.status, headers=self.headers, content=self.body if body is None else body)


def recorded(source: str, name: str) -> Recorded:
    """The recording `tests/fixtures/public/<source>/<name>.http`."""
    raw = (FIXTURES / source / f"{name}.http").read_bytes()
    head, _, body = raw.partition(b"\n\n")
    status_line, *header_lines = head.decode().splitlines()
    headers = {}
    for line in header_lines:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return Recorded(int(status_line.split()[1]), headers, body)


def public_catalog(env: dict[str, str] | None = None) -> SourceCatalog:
    return load_sources(PUBLIC_SOURCES, env=env or {})


@dataclass
class RecordedWeb:
    """The loopback stand-in for the public web. `scenario[source]` names the answer each source
    plays (default "normal"); `requests` lists (path with query, headers) as received."""

    base: str
    scenario: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {var: self.base + prefix for var, prefix in BASE_VARS.items()}

    def answer(self, target: str) -> Recorded:
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        if path == "/rdap/dns.json":
            return self._rewritten(recorded("rdap", "bootstrap"))
        if path == "/commoncrawl/collinfo.json":
            return self._rewritten(recorded("commoncrawl", "collinfo"))
        if path.startswith("/github/orgs/"):
            source = "github_orgs"
        elif path.startswith("/github/users/"):
            source = "github_users"
        else:
            source = path.split("/")[1]
        name = self.scenario.get(source, "normal")
        if source == "dns" and name == "normal":
            # One recording per question: A and MX have answers, the other types none (NOERROR).
            name = {"A": "normal", "MX": "normal_mx"}.get((query.get("type") or [""])[0], "nodata")
        return recorded(source, name)

    def _rewritten(self, answer: Recorded) -> Recorded:
        body = answer.body
        for real, prefix in HOST_REWRITES.items():
            body = body.replace(real.encode(), (self.base + prefix).encode())
        return Recorded(answer.status, answer.headers, body)


@contextmanager
def recorded_web() -> Iterator[RecordedWeb]:
    """A `RecordedWeb` on a free loopback port, stopped afterwards."""
    web: RecordedWeb | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            assert web is not None
            web.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            try:
                answer = web.answer(self.path)
            except FileNotFoundError:
                answer = Recorded(404, {"content-type": "text/plain"}, b"no recording for this path")
            self.send_response(answer.status)
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.send_header("content-length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: object) -> None:  # quiet on success, like the fleet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    web = RecordedWeb(base=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield web
    finally:
        server.shutdown()
        server.server_close()
