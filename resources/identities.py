"""The proxy resource: identities leased from the shared pool for the length of a block of work."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from investigations.config import Settings
from investigations.identities import (
    CookieStore,
    HealthPolicy,
    IdentityCatalog,
    IdentityPool,
    IdentityUnavailable,
    Lease,
    load_identities,
)
from investigations.pacing import RateLanes
from investigations.store import StateStore

DEFAULT_LEASE_TTL_S = 300.0


class IdentityPoolResource(ConfigurableResource):
    """Leases identities (proxy + cookies + fingerprint) per source. Unset fields come from
    `INVESTIGATIONS_*` (`INVESTIGATIONS_IDENTITIES`, `INVESTIGATIONS_DATABASE_URL`).

    Every lease is given back: in `finally` when the `lease()` block ends, whatever happens in it,
    and at teardown for any lease still out; a process killed before either still loses its leases
    when their TTL runs out.
    """

    identities_path: str | None = None
    database_url: str | None = None

    _store: StateStore | None = PrivateAttr(default=None)
    _pool: IdentityPool | None = PrivateAttr(default=None)
    _held: dict[str, Lease] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def settings(self) -> Settings:
        env = dict(os.environ)
        for name, value in (
            ("INVESTIGATIONS_IDENTITIES", self.identities_path),
            ("INVESTIGATIONS_DATABASE_URL", self.database_url),
        ):
            if value:
                env[name] = value
        return Settings.from_env(env)

    @property
    def catalog(self) -> IdentityCatalog:
        return load_identities(self.settings().identities_path)

    @property
    def pool(self) -> IdentityPool:
        """The engine's pool, opened on first use (registry synced) and closed at teardown."""
        return self._open()[0]

    @property
    def cookies(self) -> CookieStore:
        """The identities' cookie jars, in the pool's state store."""
        return CookieStore(self._open()[1])

    def _open(self) -> tuple[IdentityPool, StateStore]:
        with self._lock:
            if self._pool is None or self._store is None:
                self._store = StateStore.from_url(self.settings().database_url)
                self._pool = IdentityPool(self._store, self.catalog, policy=HealthPolicy(), rng=random.Random())
                self._pool.sync()
            return self._pool, self._store

    @contextmanager
    def lease(
        self,
        source: str,
        *,
        holder: str,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        lanes: RateLanes | None = None,
        min_tier: str | None = None,
    ) -> Iterator[Lease]:
        """Lease an identity for `source` for the block; released when the block ends, however it ends.

        Raises IdentityUnavailable when none can go now (all busy, resting, retired or lane-limited):
        the caller parks the work rather than waiting here with a worker held.
        """
        pool = self.pool
        lease = pool.acquire(source, holder=holder, ttl_s=ttl_s, lanes=lanes, min_tier=min_tier)
        if lease is None:
            raise IdentityUnavailable(source)
        with self._lock:
            self._held[lease.lease_id] = lease
        try:
            yield lease
        finally:
            with self._lock:
                self._held.pop(lease.lease_id, None)
            pool.release(lease)

    def held(self) -> list[Lease]:
        """Leases taken through this resource and not yet given back."""
        with self._lock:
            return list(self._held.values())

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        with self._lock:
            leftover, self._held = list(self._held.values()), {}
            pool, store = self._pool, self._store
            self._pool = self._store = None
        if pool is not None:
            for lease in leftover:
                pool.release(lease)
            pool.close()
        if store is not None:
            store.close()
