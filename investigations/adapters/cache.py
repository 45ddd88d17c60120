"""What an adapter keeps between collections: bootstrap files and index lists, for a while.

IANA's RDAP bootstrap and Common Crawl's collection list change monthly at most; asking for them
before every lookup would double the requests a source sees. The cache lives in the process (a run
asks once per TTL), keyed by the adapter and the url it came from; the adapter plans the request
when it is stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class TtlCache:
    """Values by key, each forgotten `ttl_s` after it was put. Thread-safe (batch runs use threads)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: str, *, ttl_s: float) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or self._clock() - entry[0] >= ttl_s:
            return None
        return entry[1]

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._entries[key] = (self._clock(), value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


# One per process, shared by every adapter instance (an adapter is built per collection).
BOOTSTRAPS = TtlCache()
