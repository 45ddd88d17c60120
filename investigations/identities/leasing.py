"""Leasing: how one collection holds identities of the pool, and for how long.

A collection leases one identity for its source for as long as it runs and gives it back when it
ends, whatever happens (`Leasing.held`). No identity free now means the collection waits its turn a
little, then parks (back in the queue shortly, like an open circuit): it has not failed. An identity
blocked mid-collection is given back and another leased, up to MAX_IDENTITIES_PER_COLLECTION, so one
bad identity does not fail the lead. Without a pool (no identities file) every request goes out as
the one `direct` identity, which is not leased.

Every rule about how long a lease lasts lives here, the dispatcher's too (`longest_hold_s`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from investigations.identities.sessions import IdentityBlocked, IdentitySession, Sessions

if TYPE_CHECKING:
    from investigations.pacing import RateLanes
    from investigations.sources.specs import SourceSpec

log = logging.getLogger(__name__)

# A collection whose identity gets blocked goes on with another, up to this many in all: one bad
# identity must not fail a lead, but a source that blocks every identity it sees is not worth more.
MAX_IDENTITIES_PER_COLLECTION = 3
# No identity can go to the source now (all resting, retired or lane-limited): back in the queue for
# this long. Short: a rest or a lane frees up within seconds to minutes.
NO_IDENTITY_RETRY_S = 15.0
# Every identity is leased by other collections of the source: a lease lasts one collection (about
# one identity-lane interval), so one is free again within a second or so. Wait this long at most,
# polling every LEASE_POLL_S (jittered), before parking: parking a lead only because a batch run has
# more threads than the pool has identities would send it back to the queue for nothing.
LEASE_WAIT_S = 30.0
LEASE_POLL_S = 0.1
# A lease outlives the longest a collection can spend on one request by this much (see lease_ttl_s).
LEASE_MARGIN_S = 60.0


def lease_ttl_s(spec: SourceSpec) -> float:
    """How long to lease an identity for one request of `spec` at most: every attempt timing out
    after the longest backoff, plus the time a throttled request may wait before it parks. The
    lease is extended by that much before each further request, and released as soon as it ends."""
    attempts_s = spec.retry.attempts * (spec.timeout_s + spec.retry.max_delay_s)
    worst_request_s = attempts_s + spec.throttle.park_after_s
    return worst_request_s + LEASE_MARGIN_S


def longest_hold_s(spec: SourceSpec) -> float:
    """The longest one collection of `spec` can spend on leasing and one request: waiting its turn
    for an identity, then the lease's whole life (what a run's time limit must leave room for)."""
    return lease_ttl_s(spec) + LEASE_WAIT_S


class NoIdentity(Exception):
    """No identity can send for the collection now: it should wait `retry_in_s` in the queue."""

    def __init__(self, retry_in_s: float, reason: str) -> None:
        super().__init__(reason)
        self.retry_in_s = retry_in_s
        self.reason = reason


class IdentitiesSpent(Exception):
    """Every identity the collection may use was blocked in turn: the source blocks what it sees."""

    def __init__(self, used: int, blocked: IdentityBlocked) -> None:
        super().__init__(f"{used} identities blocked in turn; last: {blocked}")
        self.last_status = blocked.last_status


class Leasing:
    """How one process's collections lease identities from its fetcher's pool (`sessions.pool`, so
    the pool that hands out a lease is the one the fetcher reports health to).

    Of a process's collections waiting for an identity of one source, one asks the pool at a time
    (the source's lease gate); the others wait their turn without asking. A batch run has more
    threads than the pool has identities, and every thread asking every poll interval cost more CPU
    than the collections themselves (two batch runs of 8 threads on 3 identities: about a quarter of
    their workers' CPU went into asking).
    """

    def __init__(self, sessions: Sessions, lanes: RateLanes | None, *,
                 max_identities: int = MAX_IDENTITIES_PER_COLLECTION, no_identity_retry_s: float = NO_IDENTITY_RETRY_S,
                 lease_wait_s: float = LEASE_WAIT_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if max_identities < 1:
            raise ValueError(f"max_identities ({max_identities}) must be >= 1")
        self.sessions = sessions
        self.lanes = lanes
        self.max_identities = max_identities
        self.no_identity_retry_s = no_identity_retry_s
        self.lease_wait_s = lease_wait_s
        self.clock = clock
        self.sleep = sleep
        self._gates: dict[str, threading.Lock] = {}
        self._gates_lock = threading.Lock()

    @contextmanager
    def held(self, spec: SourceSpec, lead_id: str, *, holder: str) -> Iterator[CollectionIdentities]:
        """The identities the collection of `lead_id` sends as, its first leased: given back when the
        block ends, however it ends. Raises NoIdentity when none could be leased."""
        identities = CollectionIdentities(self, spec, lead_id, holder=holder)
        try:
            if not self._lease_first(identities):
                busy = identities.others_leasing()
                raise NoIdentity(self.no_identity_retry_s,
                                 f"all identities for {spec.name} leased by other collections for "
                                 f"{self.lease_wait_s:.0f} s" if busy else
                                 f"no identity available for {spec.name} (all resting, retired or rate-limited)")
            yield identities
        finally:
            identities.drop()

    def _lease_first(self, identities: CollectionIdentities) -> bool:
        """Lease an identity, waiting up to `lease_wait_s` while every one is leased by other
        collections (they free up within about a lane interval); not while none is usable at all."""
        deadline = self.clock() + self.lease_wait_s
        gate = self._gate(identities.spec.name)
        if not gate.locked() and identities.lease_next():
            return True  # one was free and nobody was waiting for it before us
        real_time = self.sleep is time.sleep
        # Behind the gate until our turn or the deadline (an injected clock cannot time a real lock).
        if not (gate.acquire(timeout=max(0.0, deadline - self.clock())) if real_time else gate.acquire()):
            return False  # waited the whole time behind collections that waited longer
        try:
            while not identities.lease_next():
                if self.clock() >= deadline:
                    return False
                if not identities.others_leasing():
                    # A lease may have come back between the two questions: ask once more before
                    # taking the pool as spent.
                    if identities.lease_next():
                        return True
                    if not identities.others_leasing():
                        return False
                poll_s = LEASE_POLL_S * random.uniform(0.5, 1.5)
                if real_time and self.sessions.pool is not None:
                    self.sessions.pool.wait_for_release(poll_s)  # woken early by a lease given back here
                else:
                    self.sleep(poll_s)  # an injected sleep (tests) keeps its own time
            return True
        finally:
            gate.release()

    def _gate(self, source: str) -> threading.Lock:
        with self._gates_lock:
            return self._gates.setdefault(source, threading.Lock())


class CollectionIdentities:
    """The identities one collection sends as: at most one session at a time, each closed (its
    cookies saved, its lease released) when dropped or when the collection ends. Without a pool:
    the direct identity's session."""

    def __init__(self, leasing: Leasing, spec: SourceSpec, lead_id: str, *, holder: str) -> None:
        self._leasing = leasing
        self.lead_id = lead_id
        self._sessions = leasing.sessions
        self._pool = leasing.sessions.pool
        self.spec = spec
        self._holder = holder
        self._ttl_s = lease_ttl_s(spec)
        self._session: IdentitySession | None = None
        self._fresh = False  # the lease was just taken: no heartbeat before its first request
        self.used = 0
        self.identity_ids: list[str] = [] if self._pool is not None else [self._sessions.direct().identity_id]
        self.lease_ids: list[str] = []

    def lease_next(self) -> bool:
        """Lease an identity for the source: one whose lane can send now if any, else any free one
        (it then waits for its lane in the fetcher). False when none can be leased."""
        if self._pool is None:
            return True
        lease = None
        lanes = self._leasing.lanes
        if lanes is not None:
            lease = self._pool.acquire(self.spec.name, holder=self._holder, ttl_s=self._ttl_s, lanes=lanes,
                                       min_tier=self._min_tier())
        if lease is None:
            lease = self._pool.acquire(self.spec.name, holder=self._holder, ttl_s=self._ttl_s,
                                       min_tier=self._min_tier())
        if lease is None:
            return False
        self._session, self._fresh = self._sessions.open(lease), True
        self.used += 1
        if lease.identity_id not in self.identity_ids:
            self.identity_ids.append(lease.identity_id)
        self.lease_ids.append(lease.lease_id)
        return True

    def others_leasing(self) -> bool:
        """Whether other collections hold leases for the source now (so one may free up soon)."""
        return self._pool is not None and bool(self._pool.active_leases(self.spec.name))

    def current(self) -> IdentitySession:
        """The session to send the next request in, its lease extended first unless just taken. A
        lease lost meanwhile (expired and taken over) raises IdentityBlocked, as a blocked identity would."""
        if self._session is None:
            return self._sessions.direct()
        if self._fresh:
            self._fresh = False
        else:
            self._session.heartbeat(ttl_s=self._ttl_s)
        return self._session

    def switch(self, blocked: IdentityBlocked) -> None:
        """Go on as another identity after `blocked`: raises IdentitiesSpent when the collection has
        used as many as it may, NoIdentity when no other can be leased."""
        self.drop()
        log.warning("identity switched mid-collection: source=%s lead_id=%s identity_id=%s requests=%d reason=%s",
                    self.spec.name, self.lead_id, blocked.identity_id, blocked.requests, blocked.reason)
        if self.used >= self._leasing.max_identities:
            raise IdentitiesSpent(self.used, blocked)
        if not self.lease_next():
            raise NoIdentity(self._leasing.no_identity_retry_s,
                             f"identity {blocked.identity_id} blocked, no other available")

    def drop(self) -> None:
        """Give the current identity back: its cookies saved, its lease released."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _min_tier(self) -> str | None:
        """The source's own minimum tier, when the identities file has it (the cheapest otherwise)."""
        assert self._pool is not None
        tier = self.spec.identity_tier
        if tier in self._pool.catalog.tiers:
            return tier
        if (self.spec.name, tier) not in _UNKNOWN_TIERS_WARNED:
            _UNKNOWN_TIERS_WARNED.add((self.spec.name, tier))
            log.warning("identity_tier is not a tier of the identities file, leasing from the cheapest: "
                        "source=%s identity_tier=%s tiers=%s", self.spec.name, tier,
                        ",".join(self._pool.catalog.tiers))
        return None


_UNKNOWN_TIERS_WARNED: set[tuple[str, str]] = set()
