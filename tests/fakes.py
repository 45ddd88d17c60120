"""Test doubles shared by the suite: small, real-behaving stand-ins for time and for Slack."""

from __future__ import annotations

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
