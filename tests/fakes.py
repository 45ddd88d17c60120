"""Test doubles shared by the suite: small, real-behaving stand-ins for time and for Slack."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs


class FakeTime:
    """A clock that moves only when slept on; `on_sleep` runs at each sleep (a lead arriving, a
    lease released, say)."""

    def __init__(self, on_sleep=lambda slept: None) -> None:
        self.now, self.slept, self.on_sleep = 0.0, [], on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept.append(seconds)
        self.on_sleep(self.slept)


class FakeClock:
    """A clock that stands at `now` until the test moves it by hand, so every time comes out exact."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeSlack:
    """A local stand-in for Slack's Web API on loopback: `chat.postMessage` answers as Slack does
    and every call is kept in `messages` (with its Authorization header). `failing = True` makes it
    answer as Slack does when it cannot post (`ok: false`)."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.failing = False
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook
                body = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
                if "json" in (self.headers.get("content-type") or ""):
                    args = json.loads(body or "{}")
                else:
                    args = {k: v[0] for k, v in parse_qs(body).items()}
                method = self.path.rsplit("/", 1)[-1]
                if fake.failing:
                    answer = {"ok": False, "error": "service_unavailable"}
                else:
                    fake.messages.append({"method": method, "authorization": self.headers.get("authorization"), **args})
                    answer = {"ok": True, "channel": args.get("channel"), "ts": f"{len(fake.messages)}.000100",
                              "message": {"text": args.get("text")}}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json; charset=utf-8")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/api/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def texts(self) -> list[str]:
        return [m.get("text", "") for m in self.messages if m["method"] == "chat.postMessage"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
