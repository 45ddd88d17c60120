"""Test doubles shared by the suite: small, real-behaving stand-ins for time."""

from __future__ import annotations


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
