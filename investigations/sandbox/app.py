"""The sandbox web: one local ASGI app playing seven fake sources with seeded, deterministic behaviour.

robust answers; fragile rate-limits (429 + Retry-After); flaky errors and stalls; quiet answers 200
with nothing in it; slow answers late; banning bans a client address that asks too fast or too
regularly (403 and a captcha block page for `ban_s`); changing answers like robust, but each lead's
answer changes at a rate of its own, from hourly to never (`investigations.sandbox.changing`, on the
config's `changing_clock`). Tests and benches point the fleet at it on
loopback, so they exercise the hostile web without touching the real one. GET/POST /_control
inspect and steer it; it also shows the client addresses each source saw and the bans per address.
Every source has every knob: behind a rate limiter that passes its refusals on
(LIMITER_REFUSED_HEADER), any source can ban an address the limiter keeps refusing (`ban_refusals`).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from investigations.sandbox.behaviour import (
    SOURCES,
    VISITOR_COOKIE,
    SandboxConfig,
    SandboxState,
    SourceBehaviour,
)
from investigations.sandbox.changing import SOURCE as CHANGING
from investigations.sandbox.content import KINDS, records, render_profile

_MAX_Q_CHARS = 2048

# source -> (path, format); the HTML sources take the lead in the path, `:path` so a url lead fits.
_ROUTES = {
    "robust": ("/robust/api/lookup", "json"),
    "fragile": ("/fragile/api/search", "json"),
    "flaky": ("/flaky/profile/{kind}/{q:path}", "html"),
    "quiet": ("/quiet/api/lookup", "json"),
    "slow": ("/slow/profile/{kind}/{q:path}", "html"),
    "banning": ("/banning/profile/{kind}/{q:path}", "html"),
    "changing": ("/changing/api/lookup", "json"),
}
assert tuple(_ROUTES) == SOURCES

# What a site shows an address it has banned: a refusal with a captcha on it (g-recaptcha is one of
# the fleet's default block markers, so the page is recognised even if it came with a 200).
BLOCK_PAGE = (
    "<html><head><title>Access denied - unusual traffic</title></head><body>"
    "<h1>Access denied - unusual traffic</h1>"
    "<p>Our systems have detected unusual traffic from your network. Prove you are not a robot.</p>"
    '<div class="g-recaptcha" data-sitekey="sandbox-not-a-real-key"></div>'
    "</body></html>"
)
VISITOR_COOKIE_MAX_AGE_S = 86_400
# A rate limiter in front of the sandbox (nginx `limit_req` with `error_page 429` to a location that
# proxies on with this header) passes its refusals on: the sandbox counts them against the client
# address (the `ban_refusals` rule) and answers the 429 itself. The client address is the one
# uvicorn's proxy headers give (X-Forwarded-For from a trusted proxy, loopback by default).
LIMITER_REFUSED_HEADER = "x-limiter-refused"


def _lead_problem(kind: str, q: str) -> str | None:
    if kind not in KINDS:
        return f"kind must be one of {', '.join(KINDS)}, got {kind!r}"
    if not q.strip():
        return "q must not be empty"
    if len(q) > _MAX_Q_CHARS:
        return f"q must be at most {_MAX_Q_CHARS} characters"
    return None


async def _answer(request: Request, b: SourceBehaviour, fmt: str, state: SandboxState) -> Response:
    params = request.path_params if fmt == "html" else request.query_params
    kind, q = params.get("kind", ""), params.get("q", "")
    if problem := _lead_problem(kind, q):
        return JSONResponse({"error": problem}, status_code=400)
    decision = b.decide()
    if decision.status == 429:
        return JSONResponse(
            {"error": "rate limited", "retry_after_s": decision.retry_after_s},
            status_code=429,
            headers={"Retry-After": str(decision.retry_after_s)},
        )
    if decision.wait_s > 0:
        await asyncio.sleep(decision.wait_s)
    if decision.status != 200:
        phrase = HTTPStatus(decision.status).phrase.lower()
        return JSONResponse({"error": phrase}, status_code=decision.status)
    seed = state.config.seed
    if fmt == "html":
        return HTMLResponse(render_profile(b.name, kind, q, seed, empty=decision.empty))
    if decision.empty:
        results = []
    elif b.name == CHANGING:
        results = state.changes.records(kind, q, state.config.changing_clock())
    else:
        results = records(b.name, kind, q, seed)
    return JSONResponse({"query": {"kind": kind, "q": q}, "results": results})


def create_app(config: SandboxConfig | None = None) -> Starlette:  # noqa: C901 - its routes are nested in it
    """Build the sandbox app; its behaviour state is at `app.state.sandbox` (a SandboxState)."""
    config = config or SandboxConfig()
    state = SandboxState(config)

    def source_endpoint(source: str, fmt: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            b = state.sources[source]
            b.requests += 1
            client = request.client.host if request.client else "unknown"
            b.observe(client, request.headers.raw, request.cookies)
            refused = LIMITER_REFUSED_HEADER in request.headers
            if b.screen(client, refused=refused) is not None:
                response: Response = HTMLResponse(BLOCK_PAGE, status_code=403)
            elif refused:
                response = JSONResponse({"error": "rate limited"}, status_code=429)
            else:
                response = await _answer(request, b, fmt, state)
            if (visitor := b.visit(request.cookies.get(VISITOR_COOKIE))) is not None:
                response.set_cookie(VISITOR_COOKIE, visitor, max_age=VISITOR_COOKIE_MAX_AGE_S, path="/",
                                    httponly=True)
            # Counted when answered, so a stalled request shows in `requests` before its status.
            b.status_counts[response.status_code] += 1
            return response

        return endpoint

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def control(request: Request) -> Response:
        return JSONResponse(state.snapshot())

    async def control_reset(request: Request) -> Response:
        state.reset()
        return JSONResponse(state.snapshot())

    async def control_source(request: Request) -> Response:
        source = request.path_params["source"]
        if source not in state.sources:
            return JSONResponse({"error": f"unknown source {source!r}; known: {list(SOURCES)}"}, 404)
        try:
            changes = await request.json()
            state.configure(source, changes)
        except ValueError as exc:  # also covers a body that is not JSON
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"source": source, **state.sources[source].snapshot()})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    routes = [
        Route("/healthz", healthz),
        Route("/_control", control),
        Route("/_control/reset", control_reset, methods=["POST"]),
        Route("/_control/{source}", control_source, methods=["POST"]),
        *(Route(path, source_endpoint(name, fmt)) for name, (path, fmt) in _ROUTES.items()),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.sandbox = state
    return app


def serve(host: str = "127.0.0.1", port: int = 8800, config: SandboxConfig | None = None) -> None:
    """Run the sandbox in the foreground until interrupted (for benches and manual poking)."""
    uvicorn.run(create_app(config), host=host, port=port, log_level="warning", access_log=False)


@dataclass
class SandboxHandle:
    """A sandbox running in a background thread: where it listens, its state, and how to stop it."""

    url: str
    port: int
    app_state: SandboxState
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask uvicorn to exit and wait for the thread; force it if a stalled request holds it up."""
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout_s)

    def __enter__(self) -> SandboxHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_in_thread(
    config: SandboxConfig | None = None, host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 10.0
) -> SandboxHandle:
    """Start the sandbox on `host:port` (0: a free port) in a daemon thread, once /healthz answers.

    The socket is bound here, before the thread starts, so the port is known and nobody can take it
    in between.
    """
    app = create_app(config)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    # log_config=None leaves the host process's logging alone; a short graceful timeout keeps stop()
    # fast even while a flaky stall is in flight.
    uv_config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        log_config=None,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(uv_config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"sandbox-{bound_port}"
    )
    thread.start()
    url = f"http://{f'[{host}]' if ':' in host else host}:{bound_port}"
    handle = SandboxHandle(url, bound_port, app.state.sandbox, server, thread)
    deadline_s = time.monotonic() + timeout_s
    # trust_env=False: a proxy from the environment must never sit between us and loopback.
    with httpx.Client(trust_env=False, timeout=1.0) as client:
        while time.monotonic() < deadline_s:
            if not thread.is_alive():
                break
            if server.started:
                try:
                    if client.get(f"{url}/healthz").status_code == 200:
                        return handle
                except httpx.TransportError:
                    pass
            time.sleep(0.02)
    handle.stop()
    sock.close()
    raise RuntimeError(f"sandbox did not answer /healthz on {url} within {timeout_s:g} s")
