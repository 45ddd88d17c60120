"""Per-source behaviour of the sandbox web: rate limits, errors, stalls, delays, silent emptiness
and bans of client addresses.

Pure state, no I/O: the clock and the random draws are injected, so a test can step time and a
seed fixes the whole sequence of outcomes for a given request order. The app sleeps and answers;
this module only decides what the answer is.

Every source also records who asked: requests per client address and the last few requests'
header names, user agent and cookie names, so tests can see what went out on the wire (through
which proxy, with which fingerprint and cookies).
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from itertools import pairwise
from typing import Any

from investigations.sandbox.changing import ChangeModel

SOURCES = ("robust", "fragile", "flaky", "quiet", "slow", "banning", "changing")
# How many recent requests each source keeps for inspection (header names, user agent, cookies).
RECENT_REQUESTS = 64
# The cookie a source with `visitor_cookie` hands out, to see a returning visitor come back.
VISITOR_COOKIE = "visitor"


@dataclass
class SandboxConfig:
    """Seed and per-source defaults of a sandbox; every setting can be changed later via /_control."""

    seed: int = 7
    fragile_rate_per_s: float = 2.0
    fragile_burst: int = 2
    flaky_error_rate: float = 0.2
    flaky_stall_rate: float = 0.1
    flaky_stall_s: float = 10.0
    quiet_empty: bool = True
    slow_delay_s: tuple[float, float] = (0.5, 1.5)
    # banning: more than rate x window requests from one address within the window, or the last
    # `rhythm_gaps` gaps between its requests varying less than `rhythm_cv`, ban it for `ban_s`.
    banning_rate_per_s: float = 1.0
    banning_window_s: float = 5.0
    banning_rhythm_cv: float = 0.1
    banning_rhythm_gaps: int = 8
    banning_ban_s: float = 60.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    # changing: what moment its answers are of (epoch seconds; see `investigations.sandbox.changing`),
    # a clock of its own so a bench can run it months ahead while the rate limits keep real time.
    changing_clock: Callable[[], float] = field(default=time.time, repr=False, compare=False)


@dataclass(frozen=True)
class Settings:
    """What one source does. Every source has every knob; the defaults give each its character."""

    empty: bool = False
    rate_per_s: float | None = None  # None: no rate limit
    burst: int = 1
    error_rate: float = 0.0
    stall_rate: float = 0.0
    stall_s: float = 0.0
    delay_s: tuple[float, float] = (0.0, 0.0)
    # Bans of a client address (request.client.host): None disables the rule.
    ban_rate_per_s: float | None = None  # more than this x ban_window_s requests in the window
    ban_window_s: float = 5.0
    ban_rhythm_cv: float | None = None  # the last ban_rhythm_gaps gaps with a CV below this
    ban_rhythm_gaps: int = 8
    # this many refusals of one address within ban_window_s, by the sandbox or by a rate limiter in
    # front of it that passes its refusals on (LIMITER_REFUSED_HEADER), ban it
    ban_refusals: int | None = None
    ban_s: float = 60.0  # how long an address stays banned (403 and a block page)
    visitor_cookie: bool = False  # hand out a `visitor` cookie and count visitors who bring it back


def _number(key: str, value: Any, lo: float = 0.0, hi: float = math.inf) -> float:
    # bool is an int subclass; `true` is never a meaningful rate.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{key} must be between {lo:g} and {hi:g}, got {value!r}")
    return float(value)


def _empty(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def _rate(key: str, value: Any) -> float | None:
    if value is None:
        return None
    rate = _number(key, value)
    if rate <= 0:
        raise ValueError(f"{key} must be above 0 (or null for no limit), got {value!r}")
    return rate


def _burst(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer of at least 1, got {value!r}")
    return value


def _positive(key: str, value: Any) -> float:
    number = _number(key, value)
    if number <= 0:
        raise ValueError(f"{key} must be above 0, got {value!r}")
    return number


def _cv(key: str, value: Any) -> float | None:
    return None if value is None else _number(key, value, 0.0, 10.0)


def _gaps(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 1000:
        raise ValueError(f"{key} must be an integer between 2 and 1000, got {value!r}")
    return value


def _refusals(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer of at least 1 (or null for no such rule), got {value!r}")
    return value


def _delay(key: str, value: Any) -> tuple[float, float]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"{key} must be [lo, hi] in seconds, got {value!r}")
    lo, hi = (_number(key, v) for v in value)
    if lo > hi:
        raise ValueError(f"{key} lo must not exceed hi, got {value!r}")
    return lo, hi


_VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    "empty": _empty,
    "rate_per_s": _rate,
    "burst": _burst,
    "error_rate": lambda k, v: _number(k, v, 0.0, 1.0),
    "stall_rate": lambda k, v: _number(k, v, 0.0, 1.0),
    "stall_s": _number,
    "delay_s": _delay,
    "ban_rate_per_s": _rate,
    "ban_window_s": _positive,
    "ban_rhythm_cv": _cv,
    "ban_rhythm_gaps": _gaps,
    "ban_refusals": _refusals,
    "ban_s": _positive,
    "visitor_cookie": _empty,
}
assert set(_VALIDATORS) == {f.name for f in fields(Settings)}


def updated_settings(settings: Settings, changes: Mapping[str, Any]) -> Settings:
    """`settings` with `changes` applied, all or nothing; ValueError names the first bad key or value."""
    if not isinstance(changes, Mapping):
        raise ValueError("settings must be a JSON object")
    unknown = sorted(set(changes) - set(_VALIDATORS))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(_VALIDATORS)}")
    new = replace(settings, **{k: _VALIDATORS[k](k, v) for k, v in changes.items()})
    # One draw decides error, stall or normal, so the two shares must fit in one.
    if new.error_rate + new.stall_rate > 1.0:
        total = new.error_rate + new.stall_rate
        raise ValueError(f"error_rate + stall_rate must not exceed 1, got {total:g}")
    return new


class TokenBucket:
    """Classic token bucket: `burst` tokens, refilled at `rate_per_s`; unlimited when the rate is None."""

    def __init__(self, rate_per_s: float | None, burst: int, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens = float(burst)
        self._refilled_at_s = clock()

    def _refill(self) -> None:
        now_s = self._clock()
        if self.rate_per_s is None:
            self.tokens = float(self.burst)
        else:
            earned = (now_s - self._refilled_at_s) * self.rate_per_s
            self.tokens = min(float(self.burst), self.tokens + earned)
        self._refilled_at_s = now_s

    def reconfigure(self, rate_per_s: float | None, burst: int) -> None:
        """Change rate and burst; tokens earned so far count at the old rate."""
        self._refill()
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens = min(self.tokens, float(burst))

    def take(self) -> float:
        """Take one token: 0.0 when granted, else the seconds until one will be available."""
        self._refill()
        if self.rate_per_s is None:
            return 0.0
        # A hair of tolerance so float dust does not turn an exactly-due token into a refusal.
        if self.tokens >= 1.0 - 1e-9:
            self.tokens = max(0.0, self.tokens - 1.0)
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


@dataclass(frozen=True)
class RequestSeen:
    """What a source saw of one request: who sent it and its headers' names in arrival order."""

    client: str
    header_names: tuple[str, ...]  # lower-case, in the order they arrived
    user_agent: str | None
    cookie_names: tuple[str, ...]
    at_s: float


def gap_cv(times: list[float]) -> float:
    """Coefficient of variation of the gaps between `times` (0 for a metronome, or for no gap at all)."""
    gaps = [later - earlier for earlier, later in pairwise(times)]
    mean = statistics.fmean(gaps)
    return statistics.pstdev(gaps) / mean if mean > 0 else 0.0


@dataclass(frozen=True)
class Decision:
    """How to answer one request: the status, how long to wait first, and whether to answer empty."""

    status: int = 200
    wait_s: float = 0.0
    retry_after_s: int = 0
    empty: bool = False


class SourceBehaviour:
    """One source's settings, seeded draws, token bucket and exact counters."""

    def __init__(self, name: str, settings: Settings, seed: int, clock: Callable[[], float]) -> None:
        self.name, self.settings, self._seed, self._clock = name, settings, seed, clock
        self.reset()

    def reset(self) -> None:
        """Back to a fresh start (counters, draw sequence, full bucket), keeping the settings."""
        digest = hashlib.sha256(f"{self._seed}\x00{self.name}".encode()).digest()
        self.rng = random.Random(int.from_bytes(digest[:8], "big"))
        self.bucket = TokenBucket(self.settings.rate_per_s, self.settings.burst, self._clock)
        self.requests = 0
        self.stalls = 0
        self.status_counts: Counter[int] = Counter()
        self.clients: Counter[str] = Counter()  # requests per client address
        self.bans: Counter[str] = Counter()  # bans imposed per client address
        self.ban_reasons: Counter[str] = Counter()  # "rate", "rhythm" or "refusals" (or "manual")
        self.recent: deque[RequestSeen] = deque(maxlen=RECENT_REQUESTS)
        # The most regular the last ban_rhythm_gaps gaps of each address ever were: how close it came.
        self.lowest_rhythm_cv: dict[str, float] = {}
        self.returning_visitors = 0  # requests that brought back a visitor cookie this source issued
        self._visitors: set[str] = set()
        self._arrivals: dict[str, deque[float]] = {}
        self._refusals: dict[str, deque[float]] = {}  # when each address was refused, within the window
        self._banned_until: dict[str, float] = {}

    def configure(self, changes: Mapping[str, Any]) -> None:
        """Apply a subset of settings at runtime (ValueError, and nothing changed, when one is bad)."""
        self.settings = updated_settings(self.settings, changes)
        self.bucket.reconfigure(self.settings.rate_per_s, self.settings.burst)

    def observe(self, client: str, headers: list[tuple[bytes, bytes]], cookies: Mapping[str, str]) -> None:
        """Note who sent a request and how its headers looked (names in arrival order)."""
        self.clients[client] += 1
        names = tuple(name.decode("latin-1").lower() for name, _ in headers)
        agents = [value.decode("latin-1") for name, value in headers if name.lower() == b"user-agent"]
        agent = agents[0] if agents else None
        self.recent.append(RequestSeen(client, names, agent, tuple(sorted(cookies)), self._clock()))

    def screen(self, client: str, *, refused: bool = False) -> float | None:
        """Judge one request from `client` against the ban rules: None to let it through, else the
        seconds its ban has left (the request is refused). Every request counts, refused ones too:
        a client that keeps hammering through its ban is banned again as soon as it ends.
        `refused`: a rate limiter in front of the sandbox refused this request and passed it on, so
        it counts towards the refusals rule (and is refused whatever the rules say)."""
        s = self.settings
        if s.ban_rate_per_s is None and s.ban_rhythm_cv is None and s.ban_refusals is None and not self._banned_until:
            return None
        now_s = self._clock()
        arrivals = self._arrivals.setdefault(client, deque())
        arrivals.append(now_s)
        # Keep what either rule reads: the window's arrivals, and at least the last gaps + 1.
        while len(arrivals) > s.ban_rhythm_gaps + 1 and arrivals[0] <= now_s - s.ban_window_s:
            arrivals.popleft()
        refusals = self._refusals.setdefault(client, deque())
        if refused:
            refusals.append(now_s)
        while refusals and refusals[0] <= now_s - s.ban_window_s:
            refusals.popleft()
        until_s = self._banned_until.get(client)
        if until_s is not None and now_s < until_s:
            return until_s - now_s
        reason = None
        if s.ban_rate_per_s is not None:
            in_window = sum(1 for t in arrivals if t > now_s - s.ban_window_s)
            if in_window > s.ban_rate_per_s * s.ban_window_s + 1e-9:
                reason = "rate"
        if s.ban_rhythm_cv is not None and len(arrivals) > s.ban_rhythm_gaps:
            cv = gap_cv(list(arrivals)[-(s.ban_rhythm_gaps + 1):])
            self.lowest_rhythm_cv[client] = min(cv, self.lowest_rhythm_cv.get(client, math.inf))
            if reason is None and cv < s.ban_rhythm_cv:
                reason = "rhythm"
        if reason is None and s.ban_refusals is not None and len(refusals) >= s.ban_refusals:
            reason = "refusals"
        if reason is None:
            return None
        refusals.clear()  # the ban answers these; the next ban needs refusals of its own
        self.ban(client, reason=reason)
        return s.ban_s

    def ban(self, client: str, *, reason: str = "manual") -> None:
        """Ban `client` for the source's `ban_s` from now (the rules call this; tests may too)."""
        self._banned_until[client] = self._clock() + self.settings.ban_s
        self.bans[client] += 1
        self.ban_reasons[reason] += 1

    def banned(self) -> list[str]:
        """Addresses banned right now."""
        now_s = self._clock()
        return sorted(client for client, until_s in self._banned_until.items() if now_s < until_s)

    def visit(self, cookie: str | None) -> str | None:
        """Count a returning visitor, or return the id of a new one to hand out (None: nothing to set)."""
        if not self.settings.visitor_cookie:
            return None
        if cookie is not None and cookie in self._visitors:
            self.returning_visitors += 1
            return None
        digest = hashlib.sha256(f"{self._seed}\x00{self.name}\x00{len(self._visitors)}".encode()).hexdigest()
        visitor = f"v{len(self._visitors):05d}-{digest[:12]}"
        self._visitors.add(visitor)
        return visitor

    def decide(self) -> Decision:
        """Draw the outcome of the next admitted request (call once per valid request, in order)."""
        s = self.settings
        wait_s = self.bucket.take()
        if wait_s > 0:
            # Refused requests draw nothing, so the seeded sequence follows admitted requests only.
            return Decision(status=429, retry_after_s=max(1, math.ceil(wait_s - 1e-9)))
        # Both numbers are always drawn, so changing a rate never shifts the rest of the sequence.
        u = self.rng.random()
        delay_s = self.rng.uniform(*s.delay_s)
        if u < s.error_rate:
            return Decision(status=500 if u < s.error_rate / 2 else 503, wait_s=delay_s)
        if u < s.error_rate + s.stall_rate:
            self.stalls += 1
            return Decision(wait_s=delay_s + s.stall_s, empty=s.empty)
        return Decision(wait_s=delay_s, empty=s.empty)

    def snapshot(self) -> dict[str, Any]:
        """Counters and settings as JSON-ready data."""
        return {
            "requests": self.requests,
            "status_counts": {str(k): v for k, v in sorted(self.status_counts.items())},
            "stalls": self.stalls,
            "clients": dict(sorted(self.clients.items())),
            "bans": dict(sorted(self.bans.items())),
            "ban_reasons": dict(sorted(self.ban_reasons.items())),
            "banned_now": self.banned(),
            "lowest_rhythm_cv": {client: round(cv, 4) for client, cv in sorted(self.lowest_rhythm_cv.items())},
            "returning_visitors": self.returning_visitors,
            **{f.name: getattr(self.settings, f.name) for f in fields(Settings)},
            "delay_s": list(self.settings.delay_s),
        }


def default_settings(config: SandboxConfig) -> dict[str, Settings]:
    """Each source's starting settings from the config (validated, so a bad config fails here)."""
    base = Settings()
    return {
        "robust": base,
        "fragile": updated_settings(
            base, {"rate_per_s": config.fragile_rate_per_s, "burst": config.fragile_burst}
        ),
        "flaky": updated_settings(
            base,
            {
                "error_rate": config.flaky_error_rate,
                "stall_rate": config.flaky_stall_rate,
                "stall_s": config.flaky_stall_s,
            },
        ),
        "quiet": updated_settings(base, {"empty": config.quiet_empty}),
        "slow": updated_settings(base, {"delay_s": config.slow_delay_s}),
        "banning": updated_settings(
            base,
            {
                "ban_rate_per_s": config.banning_rate_per_s,
                "ban_window_s": config.banning_window_s,
                "ban_rhythm_cv": config.banning_rhythm_cv,
                "ban_rhythm_gaps": config.banning_rhythm_gaps,
                "ban_s": config.banning_ban_s,
                "visitor_cookie": True,
            },
        ),
        # Answers like robust; what it answers changes with time, lead by lead.
        "changing": base,
    }


class SandboxState:
    """All sources of one sandbox app; `sources[name]` is what tests flip directly."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.changes = ChangeModel(config.seed)  # the `changing` source's leads and their rates
        self.sources = {
            name: SourceBehaviour(name, settings, config.seed, config.clock)
            for name, settings in default_settings(config).items()
        }

    def __getitem__(self, source: str) -> SourceBehaviour:
        return self.sources[source]

    def configure(self, source: str, changes: Mapping[str, Any]) -> None:
        """Change one source's settings; KeyError for an unknown source, ValueError for a bad setting."""
        self.sources[source].configure(changes)

    def reset(self) -> None:
        """Reset every source's counters, draws and bucket, keeping settings."""
        for behaviour in self.sources.values():
            behaviour.reset()

    def snapshot(self) -> dict[str, Any]:
        """Every source's counters and settings, as served by GET /_control."""
        return {"seed": self.config.seed, "sources": {n: b.snapshot() for n, b in self.sources.items()}}
