"""What an adapter keeps between collections: bootstrap files and index lists, for a while.

IANA's RDAP bootstrap and Common Crawl's collection list change monthly at most; asking for them
before every lookup would double the requests a source sees. Entries are keyed by the adapter and
the url they came from; the adapter plans the request again when its entry is stale. In memory by
default (one process); with a `directory` (the fleet's data dir) every run of the fleet shares
them, so an interactive run, which collects one lead in its own process, does not ask again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class TtlCache:
    """JSON values by key, each forgotten `ttl_s` after it was put. Thread-safe (batch runs use
    threads); with a `directory`, shared by processes through one small file per key."""

    def __init__(self, directory: Path | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self._directory = directory
        self._clock = clock
        self._entries: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: str, *, ttl_s: float) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            entry = self._read(key)
        if entry is None or self._clock() - entry[0] >= ttl_s:
            return None
        with self._lock:
            self._entries[key] = entry
        return entry[1]

    def put(self, key: str, value: Any) -> None:
        entry = (self._clock(), value)
        with self._lock:
            self._entries[key] = entry
        self._write(key, entry)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _path(self, key: str) -> Path | None:
        if self._directory is None:
            return None
        return self._directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def _read(self, key: str) -> tuple[float, Any] | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            stored = json.loads(path.read_text())
            if stored.get("key") != key or not isinstance(stored.get("stored_at"), int | float):
                return None
            return float(stored["stored_at"]), stored.get("value")
        except (OSError, ValueError, AttributeError):
            return None  # missing or unreadable: asked again, and rewritten

    def _write(self, key: str, entry: tuple[float, Any]) -> None:
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written whole then renamed, so a reader in another process never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache-", suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump({"key": key, "stored_at": entry[0], "value": entry[1]}, out)
            os.replace(tmp, path)
        except OSError as exc:
            # The memory copy still serves this process; the next run asks for the file again.
            log.warning("bootstrap cache not written: path=%s error=%s", path, exc)


# The process's cache when the caller gives none (tests, tools); the fleet's resource gives one in
# its data dir.
BOOTSTRAPS = TtlCache()
