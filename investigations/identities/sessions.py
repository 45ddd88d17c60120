"""An identity's session: its HTTP client, its cookie jar, its lease and its health reports.

`Sessions` is a process's set of them: one HTTP client per identity (its proxy, its fingerprint's
headers in their order, its cookie jar), kept for the process's life so an identity always shows the
same exit and connection, and two identities never share a connection or a jar. A collection opens
an `IdentitySession` on the lease it took and hands it to the fetcher, which sends through its
client and tells it what each answer says of the identity; the session reports to the pool and
raises `IdentityBlocked` when the identity must not go on. Closing it saves the jar and gives the
lease back. Without an identities file the one session is the direct identity's, with no proxy.

Each identity's cookie jar is kept in the state store across runs (`CookieStore`). A site should
see one consistent visitor per identity: the same fingerprint (fixed in the identities
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
from urllib.parse import unquote, urlsplit

import httpx
from sqlalchemy import Connection, select

from investigations.identities.config import IdentitySpec
from investigations.identities.health import IdentityVerdict
from investigations.identities.pool import IdentityPool, Lease
from investigations.net.guard import Resolver, system_resolve
from investigations.net.pinning import PinnedTransport
from investigations.net.redaction import register_secret
from investigations.net.tls import shared_tls_context
from investigations.store import schema as s
from investigations.store.sql import upsert
from investigations.store.state import StateStore

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
        """The identity's stored cookies, expired ones left out (empty for a new identity). A read
        only: on SQLite it waits for no writer (every collection opens a session)."""
        with self._store.reading() as conn:
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
        site during the run. Expired cookies are dropped. A jar the run left as it loaded it (`base`)
        has nothing to merge, and is not written: most collections set no cookie, and each write
        would wait for the state store's one writer (on SQLite) for nothing.
        """
        now = self._clock()
        fresh = {_key(c): _from_cookie(c) for c in cookies.jar}
        if base is not None and fresh == {_key(c): _from_cookie(c) for c in base.jar}:
            return
        gone = {_key(c) for c in base.jar} - set(fresh) if base is not None else set()
        with self._tx() as conn:
            if self._pg:
                # A row to lock first, so two first saves of one identity can't both start from empty.
                upsert(conn, _C, [{"identity_id": identity_id, "cookies": "[]", "updated_at_s": now}],
                        keys=["identity_id"], update=[])
            stored = _read(conn, identity_id, lock=self._pg)
            merged = {k: v for k, v in stored.items() if k not in gone}
            merged.update(fresh)
            kept = [v for _, v in sorted(merged.items()) if v["expires"] is None or v["expires"] > now]
            upsert(conn, _C, [{"identity_id": identity_id, "cookies": json.dumps(kept), "updated_at_s": now}],
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


class IdentityBlocked(Exception):
    """Stop sending as this lease's identity at this source: the pool sent it to rest (a block page,
    a 403, too many 401/429s, a dead proxy) or the lease is no longer current. Not a failure of the
    collection: the caller releases the lease and goes on with another identity."""

    def __init__(self, identity_id: str, last_status: int | None, requests: int, reason: str) -> None:
        super().__init__(f"identity {identity_id} stopped after {requests} request(s): {reason}")
        self.identity_id = identity_id
        self.last_status = last_status
        self.requests = requests
        self.reason = reason


class IdentitySession:
    """One identity's turn: what the fetcher sends through (`client`) and tells what it heard (`report`).

    Opened by `Sessions.open` on a lease (or `Sessions.direct`, unleased); `close()` saves the jar
    and releases the lease. `heartbeat` extends the lease before a further request.
    """

    def __init__(self, *, identity_id: str, client: httpx.Client, proxied: bool, lease: Lease | None = None,
                 pool: IdentityPool | None = None, cookies: CookieStore | None = None,
                 base: httpx.Cookies | None = None) -> None:
        self.identity_id = identity_id
        self.client = client
        self.proxied = proxied
        self.lease = lease
        self._pool = pool
        self._cookies = cookies
        self._base = base  # the jar loaded at open: what `CookieStore.save` merges against

    def report(self, source: str, verdict: IdentityVerdict, *, status: int | None, answered: int | None,
               sent: int, what: str) -> None:
        """Tell the pool what one answer says about the identity (`status` as the pool should weigh
        it, `answered` as the source gave it); raise IdentityBlocked when the identity may not go on
        (sent to rest or retired here, or the lease is no longer current). A direct session has no
        pool to tell."""
        lease, pool = self.lease, self._pool
        if lease is None or pool is None:
            return
        if not pool.report(lease, verdict, status=status):
            raise IdentityBlocked(lease.identity_id, answered, sent, "the lease expired or was taken over")
        if verdict != "identity_fault":
            return
        # Only a fault can have flagged it: read back whether the pool's policy now rests it.
        health = pool.health(lease.identity_id, lease.source)
        if health is not None and health.state != "healthy":
            raise IdentityBlocked(lease.identity_id, answered, sent, f"{health.state} at {source} after {what}")

    def heartbeat(self, *, ttl_s: float) -> None:
        """Extend the lease by `ttl_s` before a further request; a lease lost meanwhile (expired and
        taken over) raises IdentityBlocked, as a blocked identity would."""
        if self.lease is None or self._pool is None:
            return
        extended = self._pool.heartbeat(self.lease, ttl_s=ttl_s)
        if extended is None:
            raise IdentityBlocked(self.lease.identity_id, None, 0, "the lease expired or was taken over")
        self.lease = extended

    def close(self) -> None:
        """Save the identity's jar, then give the lease back (idempotent)."""
        lease, self.lease = self.lease, None
        if lease is None or self._pool is None:
            return
        try:
            if self._cookies is not None:
                self._cookies.save(lease.identity_id, self.client.cookies, base=self._base)
        finally:
            self._pool.release(lease)


class Sessions:
    """A process's identity sessions over one pool: one HTTP client per identity, kept until `close()`."""

    def __init__(self, *, pool: IdentityPool | None = None, cookies: CookieStore | None = None,
                 direct_id: str = "direct", user_agent: str, transport: httpx.BaseTransport | None = None,
                 resolve: Resolver = system_resolve) -> None:
        self.pool = pool
        self.cookies = cookies
        self._transport = transport
        self._resolve = resolve
        # Redirects are followed by the fetcher, hop by hop, so each hop passes the target guard.
        # trust_env is off so proxy variables and .netrc never change the identity or add credentials
        # unseen. Without a given transport (tests give one), direct connections go through the
        # pinned transport: the name is resolved once and a checked address is dialled.
        self._direct = IdentitySession(identity_id=direct_id, proxied=False, client=httpx.Client(
            transport=transport if transport is not None else PinnedTransport(resolve=resolve,
                                                                              verify=shared_tls_context()),
            verify=shared_tls_context(), follow_redirects=False, trust_env=False,
            headers={"User-Agent": user_agent}))
        self._clients: dict[str, httpx.Client] = {}
        self._lock = threading.Lock()

    def direct(self) -> IdentitySession:
        """The unleased session: the fleet's own address, no proxy, no pool to report to."""
        return self._direct

    def open(self, lease: Lease) -> IdentitySession:
        """A session on `lease`: the identity's client with its stored cookies loaded."""
        client = self._client_for(lease.identity)
        base = None
        if self.cookies is not None:
            base = self.cookies.load(lease.identity_id)
            for cookie in base.jar:
                client.cookies.jar.set_cookie(cookie)
        return IdentitySession(identity_id=lease.identity_id, client=client, proxied=lease.identity.proxy_url is not None,
                               lease=lease, pool=self.pool, cookies=self.cookies, base=base)

    def _client_for(self, identity: IdentitySpec) -> httpx.Client:
        """The identity's client. The fingerprint's ordered headers include every default httpx would
        add, so the order on the wire is the profile's (Host first)."""
        with self._lock:
            client = self._clients.get(identity.id)
            if client is None:
                proxy = identity.proxy()
                if proxy is not None:
                    # The proxy password is sent on every request through it; never written anywhere.
                    password = urlsplit(proxy).password
                    register_secret(password)
                    register_secret(unquote(password) if password else None)
                # Through a proxy the proxy resolves the target; a direct identity is pinned.
                transport = self._transport
                if transport is None and proxy is None:
                    transport = PinnedTransport(resolve=self._resolve, verify=shared_tls_context())
                client = httpx.Client(
                    transport=transport,  # only where no proxy is set: a proxy mount takes precedence
                    proxy=proxy,
                    verify=shared_tls_context(),
                    follow_redirects=False,
                    trust_env=False,
                    headers=identity.fingerprint.ordered_headers(),
                )
                self._clients[identity.id] = client
            return client

    def close(self) -> None:
        """Close every HTTP client and its connections."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in [self._direct.client, *clients]:
            client.close()
