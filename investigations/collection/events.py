"""Plain records that cross module boundaries: what one request did, as the fetch log keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Outcome(StrEnum):
    """What one response means for the collection, the lane and the identity."""

    OK = "ok"  # a usable answer (records or a legitimately empty one)
    THROTTLED = "throttled"  # 429 or 503 asking us to slow down
    TRANSIENT = "transient"  # 5xx, 408, timeouts, connection errors: worth another try
    BLOCKED = "blocked"  # 401/403 or a block page: the identity is the problem
    PERMANENT = "permanent"  # other 4xx, unparseable answers, refused targets: trying again won't help


@dataclass(frozen=True)
class FetchEvent:
    """One request as the fetch log stores it. Never holds credentials: URLs are logged redacted."""

    source: str
    lead_id: str
    identity_id: str
    url: str
    method: str
    status: int | None
    outcome: Outcome
    latency_ms: float
    bytes: int
    attempt: int
    at: datetime
    run_id: str | None = None
    error: str | None = None


class RequestTally:
    """What one collection sent, per identity: requests and bytes of answer, counted as the fetcher
    records each attempt in the fetch log (so the same requests the log holds, without reading it
    back). One collection's tally is used by the one thread collecting it."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}

    def add(self, identity_id: str, answer_bytes: int) -> None:
        entry = self._counts.setdefault(identity_id, [0, 0])
        entry[0] += 1
        entry[1] += answer_bytes

    def per_identity(self) -> dict[str, tuple[int, int]]:
        """identity id -> (requests, bytes), in order of first use."""
        return {identity: (n, size) for identity, (n, size) in self._counts.items()}
