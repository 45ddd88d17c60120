"""A local stand-in for Slack's Web API, so the demo fleet's alerts are seen without a Slack workspace.

It speaks the part of the Web API the alert sensor uses, as slack_sdk's `WebClient` calls it
(`base_url` + method name, e.g. `http://127.0.0.1:8900/api/chat.postMessage`):

- `POST /api/chat.postMessage`, JSON or form body, token as a bearer header (or a form `token`):
  answers `{"ok": true, "channel": ..., "ts": ..., "message": {...}}`, or Slack's errors
  (`not_authed`, `invalid_auth`, `channel_not_found`, `no_text`);
- `POST /api/auth.test`: answers who the token belongs to, as Slack does.

Every message posted is kept and shown as one line (`[slack #investigations] ...`); `GET /messages`
returns them as JSON and `GET /` as a page to open in a browser. The token is never shown: not in
the lines, the page or the JSON, and requests are not logged.
"""

from __future__ import annotations

import hmac
import html
import json
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from investigations.net.redaction import SecretRegistry

API_PREFIX = "/api/"
MAX_BODY_BYTES = 1 << 20
# Slack's link markup, `<url|label>` or `<url>`, shown as `label (url)` / `url` on the console.
_SLACK_LINK = re.compile(r"<([^<>|\s]+)(?:\|([^<>]*))?>")


@dataclass(frozen=True)
class ApiCall:
    """One Web API call the stand-in accepted: the method, its arguments (without a body `token`)
    and the Authorization header as sent. Only code given the call sees the header."""

    method: str
    args: dict[str, Any]
    authorization: str | None


def readable(text: str) -> str:
    """A message's text on one line, Slack's links as `label (url)` and its escapes undone."""

    def link(match: re.Match[str]) -> str:
        target, label = match.group(1), match.group(2)
        return f"{label} ({target})" if label else target

    flat = " ".join(_SLACK_LINK.sub(link, text).split())
    return flat.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def console_line(channel: str, text: str) -> str:
    """A posted message as one line of the console: `[slack #channel] text`."""
    return f"[slack {channel or '?'}] {readable(text)}"


def _stdout(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


class SlackStandIn:
    """Slack's Web API on `host:port` (0: a free port), served from a daemon thread until `close()`.

    `token`: the one token it accepts (unset: any bearer token). `echo` gets one line per message
    posted (default: printed to stdout; None: quiet). `on_call` sees every call accepted, whatever
    its method. `failing = True` answers as Slack does when it cannot post (`ok: false`).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None,
                 echo: Callable[[str], None] | None = _stdout,
                 on_call: Callable[[ApiCall], None] | None = None) -> None:
        self.messages: list[dict[str, Any]] = []
        self.failing = False
        self._token = token
        self._echo = echo
        self._on_call = on_call
        self._lock = threading.Lock()
        self._secrets = SecretRegistry()
        self._secrets.register(token)
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        bound = self._server.server_address[1]
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{bound}/"
        self.api_url = f"{self.base_url}api/"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
                                        name=f"slack-{bound}")
        self._thread.start()

    def __enter__(self) -> SlackStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def received(self) -> list[dict[str, Any]]:
        """The messages posted so far, oldest first."""
        with self._lock:
            return list(self.messages)

    # -- the Web API -------------------------------------------------------------------------------

    def answer(self, method: str, args: dict[str, Any], authorization: str | None) -> dict[str, Any]:
        """What Slack would answer to `method` called with `args` (a body `token` included)."""
        body_token = args.pop("token", None)
        bearer = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
        presented = bearer or (str(body_token) if body_token else None)
        self._secrets.register(presented)
        if self.failing:
            return {"ok": False, "error": "service_unavailable"}
        refused = self._refusal(presented)
        if refused:
            self._show(f"[slack] refused {method}: {refused}")
            return {"ok": False, "error": refused}
        if method == "auth.test":
            self._accepted(ApiCall(method, args, authorization))
            return {"ok": True, "url": self.base_url, "team": "Investigations (local stand-in)", "user": "investigations",
                    "team_id": "T00000000", "user_id": "U00000000", "bot_id": "B00000000",
                    "is_enterprise_install": False}
        if method == "chat.postMessage":
            return self._post_message(ApiCall(method, args, authorization))
        return {"ok": False, "error": "unknown_method", "req_method": method}

    def _refusal(self, presented: str | None) -> str | None:
        if not presented:
            return "not_authed"
        if self._token is not None and not hmac.compare_digest(presented.encode(), self._token.encode()):
            return "invalid_auth"
        return None

    def _post_message(self, call: ApiCall) -> dict[str, Any]:
        channel = str(call.args.get("channel") or "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        text = self._secrets.replace(str(call.args.get("text") or ""))
        if not text and not call.args.get("blocks") and not call.args.get("attachments"):
            return {"ok": False, "error": "no_text"}
        with self._lock:
            ts = f"{int(time.time())}.{len(self.messages) + 1:06d}"
            message = {"channel": channel, "text": text, "ts": ts,
                       "received_at": datetime.now(UTC).isoformat(timespec="seconds")}
            self.messages.append(message)
        self._accepted(call)
        self._show(console_line(channel, text or "(blocks only)"))
        return {"ok": True, "channel": channel, "ts": ts,
                "message": {"type": "message", "text": text, "ts": ts, "bot_id": "B00000000"}}

    def _accepted(self, call: ApiCall) -> None:
        if self._on_call is not None:
            self._on_call(call)

    def _show(self, line: str) -> None:
        if self._echo is not None:
            self._echo(self._secrets.replace(line))

    # -- what a person reads -----------------------------------------------------------------------

    def page(self) -> str:
        """The messages as a small HTML page, newest first, refreshed every 5 s."""
        rows = "".join(
            f"<tr><td>{html.escape(m['received_at'])}</td><td>{html.escape(m['channel'])}</td>"
            f"<td>{html.escape(readable(m['text']))}</td></tr>"
            for m in reversed(self.received()))
        body = (f"<table><tr><th>received (UTC)</th><th>channel</th><th>message</th></tr>{rows}</table>" if rows else
                "<p>No alert yet. The <code>alert_operators_in_slack</code> sensor posts here once per incident: "
                "failing checks, a circuit opening, new dead letters.</p>")
        return ("<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='5'>"
                "<title>Slack alerts (local stand-in)</title><style>body{font-family:sans-serif;margin:2em}"
                "td,th{text-align:left;padding:.3em .8em;border-bottom:1px solid #ddd;vertical-align:top}</style>"
                f"</head><body><h1>Slack alerts (local stand-in)</h1><p>What the fleet posted to Slack's Web API at "
                f"<code>{html.escape(self.api_url)}</code>; as JSON: <a href='/messages'>/messages</a>.</p>"
                f"{body}</body></html>")


def _read_args(handler: BaseHTTPRequestHandler, query: str) -> dict[str, Any] | str:
    """The call's arguments (query string and body), or Slack's error for a body it cannot read."""
    args: dict[str, Any] = dict(parse_qsl(query))
    length = int(handler.headers.get("content-length") or 0)
    if length > MAX_BODY_BYTES:
        return "request_too_large"
    raw = handler.rfile.read(length).decode("utf-8", "replace") if length else ""
    if "json" in (handler.headers.get("content-type") or ""):
        try:
            parsed = json.loads(raw or "{}")
        except json.JSONDecodeError:
            return "invalid_json"
        if not isinstance(parsed, dict):
            return "invalid_json"
        args.update(parsed)
    else:
        args.update(parse_qsl(raw))
    return args


def _handler(stand_in: SlackStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "slack-stand-in"

        def do_POST(self) -> None:  # noqa: N802 - the http.server hook
            url = urlsplit(self.path)
            if not url.path.startswith(API_PREFIX):
                self._send(404, "application/json", {"ok": False, "error": "not_found"})
                return
            args = _read_args(self, url.query)
            if isinstance(args, str):
                self._send(200, "application/json", {"ok": False, "error": args})
                return
            method = url.path[len(API_PREFIX):].strip("/")
            self._send(200, "application/json", stand_in.answer(method, args, self.headers.get("authorization")))

        def do_GET(self) -> None:  # noqa: N802
            path = urlsplit(self.path).path
            if path in ("/", "/index.html"):
                self._send(200, "text/html", stand_in.page())
            elif path == "/messages":
                self._send(200, "application/json", stand_in.received())
            elif path == "/healthz":
                self._send(200, "text/plain", "ok")
            else:
                self._send(404, "application/json", {"ok": False, "error": "not_found"})

        def _send(self, status: int, content_type: str, payload: object) -> None:
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            self.send_response(status)
            self.send_header("content-type", f"{content_type}; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a request line may carry a token in its query string: nothing is logged

    return Handler
