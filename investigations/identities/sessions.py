"""Each identity's cookie jar, kept in the state store across runs.

A site should see one consistent visitor per identity: the same fingerprint (fixed in the identities
file) and the same cookies, whichever run or process sends as that identity. Saving merges into the
stored jar instead of replacing it, so two runs that used the identity at once both keep what they
were given; a cookie the site deleted during a run is deleted from the store too when the run passes
the jar it started from (`base`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from http.cookiejar import Cookie
from typing import Any

import httpx
from sqlalchemy import Connection, select

from investigations.store import schema as s
from investigations.store.state import StateStore, _upsert

_C = s.identity_cookies
_Key = tuple[str, str, str]  # (domain, path, name): what identifies one cookie in a jar


class CookieStore:
    """Load and save identities' cookie jars (JSON of name, value, domain, path, expiry, secure)."""

    def __init__(self, store: StateStore, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._pg = store.dialect == "postgresql"
        self._lock: threading.Lock | nullcontext[None] = nullcontext() if self._pg else threading.Lock()

    def load(self, identity_id: str) -> httpx.Cookies:
        """The identity's stored cookies, expired ones left out (empty for a new identity)."""
        with self._store.engine.begin() as conn:
            stored = _read(conn, identity_id)
        now = self._clock()
        cookies = httpx.Cookies()
        for entry in stored.values():
            if entry["expires"] is None or entry["expires"] > now:
                cookies.jar.set_cookie(_to_cookie(entry))
        return cookies

    def save(self, identity_id: str, cookies: httpx.Cookies, *, base: httpx.Cookies | None = None) -> None:
        """Merge `cookies` into the identity's stored jar in one transaction.

        Cookies in `cookies` replace stored ones with the same (domain, path, name); stored cookies
        it lacks stay, unless they are in `base` (the jar this run loaded) and so were deleted by the
        site during the run. Expired cookies are dropped.
        """
        now = self._clock()
        fresh = {_key(c): _from_cookie(c) for c in cookies.jar}
        gone = {_key(c) for c in base.jar} - set(fresh) if base is not None else set()
        with self._tx() as conn:
            if self._pg:
                # A row to lock first, so two first saves of one identity can't both start from empty.
                _upsert(conn, _C, [{"identity_id": identity_id, "cookies": "[]", "updated_at_s": now}],
                        keys=["identity_id"], update=[])
            stored = _read(conn, identity_id, lock=self._pg)
            merged = {k: v for k, v in stored.items() if k not in gone}
            merged.update(fresh)
            kept = [v for _, v in sorted(merged.items()) if v["expires"] is None or v["expires"] > now]
            _upsert(conn, _C, [{"identity_id": identity_id, "cookies": json.dumps(kept), "updated_at_s": now}],
                    keys=["identity_id"], update=["cookies", "updated_at_s"])

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        # SQLite's BEGIN IMMEDIATE already serializes the read-merge-write; the lock only keeps this
        # process's threads out of SQLite's sleeping busy handler. Postgres locks the row (FOR UPDATE).
        with self._lock, self._store.engine.begin() as conn:
            yield conn

def _read(conn: Connection, identity_id: str, *, lock: bool = False) -> dict[_Key, dict[str, Any]]:
    query = select(_C.c.cookies).where(_C.c.identity_id == identity_id)
    raw = conn.execute(query.with_for_update() if lock else query).scalar()
    entries = json.loads(raw) if raw else []
    return {(e["domain"], e["path"], e["name"]): e for e in entries}


def _key(cookie: Cookie) -> _Key:
    return (cookie.domain, cookie.path, cookie.name)


def _from_cookie(cookie: Cookie) -> dict[str, Any]:
    return {"name": cookie.name, "value": cookie.value, "domain": cookie.domain, "path": cookie.path,
            "expires": cookie.expires, "secure": cookie.secure}


def _to_cookie(entry: dict[str, Any]) -> Cookie:
    domain = entry["domain"]
    return Cookie(
        version=0, name=entry["name"], value=entry["value"], port=None, port_specified=False,
        domain=domain, domain_specified=bool(domain), domain_initial_dot=domain.startswith("."),
        path=entry["path"], path_specified=True, secure=bool(entry.get("secure")), expires=entry["expires"],
        discard=entry["expires"] is None, comment=None, comment_url=None, rest={},
    )
