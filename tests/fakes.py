"""Test doubles shared by the suite: small, real-behaving stand-ins for time and for Slack, and a
probe of whether a call waits for SQLite's one writer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from investigations.demo.slack import ApiCall, SlackStandIn


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
    """A local stand-in for Slack's Web API on loopback (the demo fleet's, quiet): `chat.postMessage`
    answers as Slack does and every call is kept in `messages` (with its Authorization header).
    `failing = True` makes it answer as Slack does when it cannot post (`ok: false`)."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self._api = SlackStandIn(echo=None, on_call=self._keep)
        self.url = self._api.api_url

    def _keep(self, call: ApiCall) -> None:
        self.messages.append({"method": call.method, "authorization": call.authorization, **call.args})

    @property
    def failing(self) -> bool:
        return self._api.failing

    @failing.setter
    def failing(self, value: bool) -> None:
        self._api.failing = value

    def texts(self) -> list[str]:
        return [m.get("text", "") for m in self.messages if m["method"] == "chat.postMessage"]

    def close(self) -> None:
        self._api.close()


def runs_without_the_write_lock(store: Any, call: Callable[[], object], *, wait_s: float = 5.0) -> bool:
    """Whether `call` finishes on a SQLite state store while another connection holds its write lock
    (as another process's writes would): a call that wrote, or read inside a write transaction,
    waits for the lock (the busy timeout is 30 s), so it is still waiting after `wait_s`."""
    import threading

    from investigations.store import StateStore

    writer = StateStore.from_url(str(store.engine.url))
    done = threading.Event()

    def run() -> None:
        call()
        done.set()

    try:
        with writer.engine.begin() as conn:  # BEGIN IMMEDIATE: the write lock, held until the block ends
            conn.exec_driver_sql("SELECT 1")
            threading.Thread(target=run, daemon=True).start()
            finished = done.wait(wait_s)
        done.wait(wait_s)  # a call that waited finishes once the lock is free, before the store closes
        return finished
    finally:
        writer.close()
