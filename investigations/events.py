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
