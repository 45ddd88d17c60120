"""The identity pool: identities leased per source from the state store, never owned.

`acquire` picks, in one transaction, the least recently used healthy identity of the tier the source
is served from, that is not leased for that source, whose range is not resting there and (given the
rate lanes) whose lane at that source can send now. On SQLite that transaction is the store's
`BEGIN IMMEDIATE`; on Postgres the candidate lease slots are locked with `FOR UPDATE SKIP LOCKED`, so
concurrent acquirers step over each other's picks instead of queueing behind them.

A lease carries a fencing token. Health reported under a lease is applied only while its token is
the slot's current one and it has not expired: a worker that stalled past its TTL, whose identity
was then leased to someone else, cannot write stale health back. A killed run's leases come back
on their own when their TTL runs out.

The lease path (acquire, heartbeat, release) runs for every collection, so each call is one
statement: built once from the Table objects (translated to the store's schema), compiled once, and
run on a plain DB-API connection, without SQLAlchemy's per-call execution machinery, which costs more
than the statement itself. On SQLite that connection is one per pool, used under a per-file lock in
`BEGIN IMMEDIATE` transactions that group the statements of every thread waiting at that moment into
one commit. On Postgres the pool keeps its own few autocommit connections (outside the engine's
pool, which stays free for everything else), the statements PREPAREd on each, with
`synchronous_commit` off: a lease commit does not wait for the WAL flush (milliseconds on a slow
disk). A Postgres crash can then forget the last fraction of a second of lease changes; that is
safe for fencing because every check names the lease id as well as the token, so a forgotten lease
is never mistaken for its successor, and a forgotten release just waits for its TTL. (For that
fraction of a second after a crash, two holders may hold one identity at a source.) Health, ranges
and tiers go through SQLAlchemy transactions as usual, durably.
go through SQLAlchemy transactions as usual, durably.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Table,
    and_,
    func,
    or_,
    select,
    update,
)

from investigations.identities.config import IdentityCatalog, IdentitySpec
from investigations.identities.health import (
    DEFAULT_POLICY,
    HEALTHY,
    HealthPolicy,
    IdentityHealth,
    IdentityVerdict,
    choose_tier,
    flagged,
    health_event,
    next_health,
    next_tier_state,
    range_should_rest,
    rest_s,
)
from investigations.pacing.lanes import identity_lane_name
from investigations.store import schema as s
from investigations.store.leases import (
    TABLES,
    LeaseHotPath,
    acquire_statement,
    lease_statements,
    sqlite_write_lock,
    tables_in_schema,
)
from investigations.store.sql import upsert
from investigations.store.state import StateStore

if TYPE_CHECKING:  # the lanes are only a type here: the pool reads their table itself
    from investigations.pacing.lanes import RateLanes

_L = s.identity_leases
_I = s.identities
_H = s.identity_health
_R = s.range_rests
_T = s.tier_state
_RL = s.rate_lanes

# Connections the pool keeps for leases on Postgres; callers beyond this many at once wait their turn.
DEFAULT_LEASE_CONNECTIONS = 8
# A lane whose next slot is at most this far ahead counts as free: the wait is within jitter.
DEFAULT_LANE_TOLERANCE_S = 0.05


class IdentityUnavailable(RuntimeError):
    """No identity can be leased for the source now: all busy, resting, retired or lane-limited."""

    def __init__(self, source: str) -> None:
        super().__init__(f"no identity available for source {source!r} now")
        self.source = source


@dataclass(frozen=True)
class Lease:
    """The right to send requests to `source` as one identity until `expires_at_s` (epoch seconds).

    `identity` has what the request needs (proxy, fingerprint); its proxy is a SecretStr and it is
    left out of the repr anyway, so a logged lease never shows credentials.
    """

    lease_id: str
    identity_id: str
    source: str
    fencing_token: int
    expires_at_s: float
    ttl_s: float
    holder: str
    identity: IdentitySpec = field(repr=False, compare=False)
    tier_floor: int = field(default=0, repr=False)  # the source's own minimum tier (min_tier)


class IdentityPool:
    """Identities shared by every run and process through the state store."""

    def __init__(
        self,
        store: StateStore,
        identities: IdentityCatalog,
        *,
        policy: HealthPolicy = DEFAULT_POLICY,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        lane_tolerance_s: float = DEFAULT_LANE_TOLERANCE_S,
        lease_connections: int = DEFAULT_LEASE_CONNECTIONS,
    ) -> None:
        self._store = store
        self.catalog = identities
        self.policy = policy
        self._clock = clock
        self._rng = rng or random.Random()
        self._lane_tolerance_s = lane_tolerance_s
        self._pg = store.dialect == "postgresql"
        self._write_lock = nullcontext() if self._pg else sqlite_write_lock(store)
        self._seeded: set[str] = set()
        self._synced = False
        self._ranks = {tier: rank for rank, tier in enumerate(identities.tiers)}
        self._specs = {spec.id: spec for spec in identities.identities}
        tables = tables_in_schema(store.schema)
        self._hot = LeaseHotPath(store, lease_statements(tables, pg=self._pg), write_lock=self._write_lock,
                             connections=lease_connections)
        # The same acquire through SQLAlchemy, for the escalation path (several statements, one transaction).
        self._acquire_stmt = {lanes: acquire_statement(TABLES, lanes=lanes, pg=self._pg) for lanes in (False, True)}
        # Signalled when this process gives a lease back: its collections waiting for an identity ask
        # at once instead of at their next poll (an identity sends one request at a time, so the
        # gap between one holder and the next is that identity's rate lost).
        self._released = threading.Condition()

    def close(self) -> None:
        """Close the pool's own lease connections (the store's engine is the store's to close)."""
        self._hot.close()

    # -- registry -------------------------------------------------------------------------------

    def sync(self) -> None:
        """Upsert the identities of the file into the registry; ones no longer in it turn inactive."""
        now = self._clock()
        rows = [
            {
                "identity_id": spec.id,
                "range": spec.range,
                "tier": spec.tier,
                "tier_rank": self._ranks[spec.tier],
                "cost_per_request_usd": spec.cost_per_request_usd,
                "cost_per_mb_usd": spec.cost_per_mb_usd,
                "proxy": spec.redacted_proxy_url(),
                "active": True,
                "synced_at_s": now,
            }
            for spec in self.catalog.identities
        ]
        with self._tx() as conn:
            upsert(conn, _I, rows, keys=["identity_id"], update=[k for k in rows[0] if k != "identity_id"])
            conn.execute(update(_I).where(_I.c.identity_id.not_in(self.catalog.ids)).values(active=False))
        self._synced = True

    # -- leases ---------------------------------------------------------------------------------

    def acquire(
        self,
        source: str,
        *,
        holder: str,
        ttl_s: float,
        lanes: RateLanes | None = None,
        min_tier: str | None = None,
    ) -> Lease | None:
        """Lease the best identity for `source` now, or None when none can go.

        Best: of the tier the source is served from (the cheapest, unless escalated, and never below
        `min_tier`), healthy there, its range not resting there, not leased for it already, and the
        least recently leased for it. With `lanes` (which must share this pool's store), identities
        whose lane at the source is booked further ahead than the tolerance are skipped too.

        When nothing is free and the tier has no healthy identity left at the source, the source
        escalates to the next costlier tier that has one (kept in `tier_state`), and the choice is
        made again in the same transaction as the escalation.
        """
        if ttl_s <= 0:
            raise ValueError(f"ttl_s ({ttl_s}) must be > 0")
        floor = self.catalog.tier_rank(min_tier) if min_tier is not None else 0
        self._prepare(source)
        now = self._clock()
        params: dict[str, Any] = {
            "p_source": source,
            "p_now": now,
            "p_floor": floor,
            "p_lane_prefix": identity_lane_name(source, ""),
            "p_lane_limit": now + self._lane_tolerance_s,
            "p_lease_id": uuid.uuid4().hex,
            "p_holder": holder,
            "p_expires": now + ttl_s,
        }
        rows = self._hot.run("acquire_lanes" if lanes is not None else "acquire", params)
        if not rows:
            # Nothing free. Busy, or is the source's tier spent there? The rare path, in one transaction.
            with self._tx() as conn:
                if self._escalate(conn, source, floor=floor, now=now):
                    rows = [tuple(row) for row in conn.execute(self._acquire_stmt[lanes is not None], params)]
        if not rows:
            return None
        identity_id, token = rows[0]
        if identity_id not in self._specs:
            self.release(Lease(params["p_lease_id"], identity_id, source, token, params["p_expires"], ttl_s, holder,
                               identity=self.catalog.identities[0]))
            raise RuntimeError(
                f"identity {identity_id!r} is active in the state store but not in this process's identities "
                "file: every process of the fleet must load the same file"
            )
        return Lease(lease_id=params["p_lease_id"], identity_id=identity_id, source=source, fencing_token=token,
                     expires_at_s=params["p_expires"], ttl_s=ttl_s, holder=holder,
                     identity=self._specs[identity_id], tier_floor=floor)

    def heartbeat(self, lease: Lease, *, ttl_s: float | None = None) -> Lease | None:
        """Extend a live lease by `ttl_s` (its own TTL by default) from now; None if it was lost."""
        now = self._clock()
        expires = now + (ttl_s if ttl_s is not None else lease.ttl_s)
        extended = self._hot.run("heartbeat", {**_fence(lease), "p_now": now, "p_expires": expires})
        return replace(lease, expires_at_s=expires) if extended else None

    def release(self, lease: Lease) -> bool:
        """Give the identity back at once. Idempotent: False when already released or taken over."""
        released = bool(self._hot.run("release", _fence(lease)))
        if released:
            with self._released:
                self._released.notify_all()
        return released

    def release_held_by(self, holder: str) -> int:
        """Give back every lease `holder` still holds (a run ending: none of its collections sends
        any more); how many there were. Each collection gives its own back as it ends, so this finds
        only what a collection could not (a thread abandoned past the run's end)."""
        with self._store.engine.begin() as conn:
            released = conn.execute(
                update(_L).where(_L.c.holder == holder, _L.c.released.is_(False)).values(released=True)
            ).rowcount
        if released:
            with self._released:
                self._released.notify_all()
        return int(released or 0)

    def wait_for_release(self, timeout_s: float) -> None:
        """Sleep until this process releases a lease, or `timeout_s` (leases given back by other
        processes are only seen by asking again)."""
        with self._released:
            self._released.wait(timeout_s)

    # -- health -----------------------------------------------------------------------------------

    def report(self, lease: Lease, verdict: IdentityVerdict, *, status: int | None) -> bool:
        """Apply what one answer says about the lease's identity at its source.

        Refused (False) unless the lease is still current: its fencing token is the slot's, it was
        not released and has not expired. Applies the identity's health, rests its range when
        several of the range were flagged at the source within the window, and moves the source's
        tier (a run of successes on an escalated tier steps it down).
        """
        now = self._clock()
        event = health_event(verdict, status, self.policy)
        slot = select(_L.c.fencing_token, _L.c.lease_id, _L.c.released, _L.c.expires_at_s).where(
            _L.c.source == lease.source, _L.c.identity_id == lease.identity_id
        )
        if event in ("none", "success") and self._rank(lease) <= lease.tier_floor:
            # Read first, without the write lock (SQLite has one writer, and every answer reports):
            # a source's fault, or a success of an identity with nothing to forgive, writes nothing.
            with self._store.reading() as conn:
                if not _current(conn.execute(slot).first(), lease, now):
                    return False
                before = _read_health(conn, lease.identity_id, lease.source) or HEALTHY
                if event == "none" or next_health(before, event, now_s=now, policy=self.policy,
                                                  rng=self._rng) == before:
                    return True
        with self._tx() as conn:
            if not _current(conn.execute(slot.with_for_update() if self._pg else slot).first(), lease, now):
                return False
            if event == "none":
                return True  # the source's fault: nothing to hold against the identity
            before = _read_health(conn, lease.identity_id, lease.source) or HEALTHY
            after = next_health(before, event, now_s=now, policy=self.policy, rng=self._rng)
            if after != before:
                upsert(conn, _H, [_health_row(lease.identity_id, lease.source, after, now)],
                        keys=["identity_id", "source"], update=_HEALTH_COLUMNS)
            if flagged(before, after):
                self._maybe_rest_range(conn, lease, now)
            rank = self._rank(lease)
            if rank > lease.tier_floor:  # only an escalated tier can step down
                self._update_tier(conn, lease, rank, event, now)
        return True

    def _rank(self, lease: Lease) -> int:
        return self._ranks.get(lease.identity.tier, 0)

    # -- reading state (tests, fleet status, CLI) ---------------------------------------------

    def health(self, identity_id: str, source: str) -> IdentityHealth | None:
        """The stored health of an identity at a source, or None if it never had a report."""
        with self._store.engine.begin() as conn:
            return _read_health(conn, identity_id, source)

    def range_rest_until_s(self, range_name: str, source: str) -> float | None:
        """Until when a range rests at a source (may be in the past), or None if it never rested."""
        with self._store.engine.begin() as conn:
            return conn.execute(
                select(_R.c.rest_until_s).where(_R.c.range == range_name, _R.c.source == source)
            ).scalar()

    def current_tier(self, source: str) -> str:
        """The tier the source is served from as stored (escalation happens at acquire)."""
        with self._store.engine.begin() as conn:
            index = conn.execute(select(_T.c.tier_index).where(_T.c.source == source)).scalar() or 0
        return self.catalog.tiers[min(index, len(self.catalog.tiers) - 1)]

    def active_leases(self, source: str | None = None) -> list[dict[str, Any]]:
        """Leases neither released nor expired: source, identity, holder, token, expiry."""
        now = self._clock()
        query = select(_L.c.source, _L.c.identity_id, _L.c.holder, _L.c.fencing_token, _L.c.expires_at_s).where(
            _L.c.released.is_(False), _L.c.expires_at_s > now
        ).order_by(_L.c.source, _L.c.identity_id)
        if source is not None:
            query = query.where(_L.c.source == source)
        with self._store.engine.begin() as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    # -- internals --------------------------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with self._write_lock, self._store.engine.begin() as conn:
            yield conn

    def _prepare(self, source: str) -> None:
        """Sync the registry once, and create the source's lease slots once, per pool."""
        if not self._synced:
            self.sync()
        if source in self._seeded:
            return
        rows = [
            {"source": source, "identity_id": identity_id, "lease_id": None, "holder": None, "fencing_token": 0,
             "acquired_at_s": 0.0, "expires_at_s": 0.0, "released": True}
            for identity_id in self.catalog.ids
        ]
        with self._tx() as conn:
            upsert(conn, _L, rows, keys=["source", "identity_id"], update=[])
        self._seeded.add(source)

    def _escalate(self, conn: Connection, source: str, *, floor: int, now: float) -> bool:
        """Nothing was free: if that is because the source's tier has no healthy identity left there,
        move the source to the tier choose_tier names and say so (True); False if it is just busy."""
        healthy = (
            select(_I.c.tier_rank)
            .select_from(
                _I.outerjoin(_H, and_(_H.c.identity_id == _I.c.identity_id, _H.c.source == source))
                .outerjoin(_R, and_(_R.c.range == _I.c.range, _R.c.source == source))
            )
            .where(_I.c.active, _available(_H, now), or_(_R.c.rest_until_s.is_(None), _R.c.rest_until_s <= now))
            .group_by(_I.c.tier_rank)
        )
        ranks = set(conn.scalars(healthy))
        by_tier = [rank in ranks for rank in range(len(self.catalog.tiers))]
        stored = conn.execute(select(_T.c.tier_index, _T.c.successes_in_row).where(_T.c.source == source)).first()
        current = max(stored.tier_index if stored else 0, floor)
        chosen = choose_tier(current, by_tier, floor=floor)
        if chosen is None or chosen == current:
            return False
        upsert(conn, _T, [{"source": source, "tier_index": chosen, "successes_in_row": 0, "updated_at_s": now}],
                keys=["source"], update=["tier_index", "successes_in_row", "updated_at_s"])
        return True

    def _update_tier(self, conn: Connection, lease: Lease, rank: int, event: Any, now: float) -> None:
        query = select(_T.c.tier_index, _T.c.successes_in_row).where(_T.c.source == lease.source)
        stored = conn.execute(query.with_for_update() if self._pg else query).first()
        if stored is None:
            return
        tier, streak = next_tier_state(stored.tier_index, stored.successes_in_row, identity_rank=rank, event=event,
                                       floor=lease.tier_floor, policy=self.policy)
        if (tier, streak) != (stored.tier_index, stored.successes_in_row):
            conn.execute(update(_T).where(_T.c.source == lease.source)
                         .values(tier_index=tier, successes_in_row=streak, updated_at_s=now))

    def _maybe_rest_range(self, conn: Connection, lease: Lease, now: float) -> None:
        range_name = lease.identity.range
        if self._pg:
            # Two identities of the range flagged at once must see each other's flag: take turns per
            # (range, source). (SQLite's immediate transactions already take turns.)
            key = f"identities:range:{range_name}:{lease.source}"
            conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(key))))
        query = select(_R.c.rest_until_s, _R.c.rests).where(_R.c.range == range_name, _R.c.source == lease.source)
        resting = conn.execute(query).first()
        if resting is not None and resting.rest_until_s > now:
            return  # already resting: more flags from leases taken before it don't extend the rest
        flags = conn.scalars(
            select(_H.c.flagged_at_s)
            .join(_I, _I.c.identity_id == _H.c.identity_id)
            .where(_H.c.source == lease.source, _I.c.range == range_name,
                   _H.c.flagged_at_s >= now - self.policy.range_window_s)
        ).all()
        if not range_should_rest(flags, now_s=now, policy=self.policy):
            return
        rests = 0
        if resting is not None and now - resting.rest_until_s < self.policy.range_forgive_after_s:
            rests = resting.rests
        row = {"range": range_name, "source": lease.source,
               "rest_until_s": now + rest_s(rests, self.policy, self._rng), "rests": rests + 1, "updated_at_s": now}
        upsert(conn, _R, [row], keys=["range", "source"], update=["rest_until_s", "rests", "updated_at_s"])


_HEALTH_COLUMNS = ["score", "state", "rests", "rest_until_s", "flagged_at_s", "successes_in_row", "updated_at_s"]


def _available(health: Table, now: Any) -> Any:
    """SQL twin of health.is_available: no row, healthy, or resting with the rest over."""
    return or_(health.c.state.is_(None), health.c.state == "healthy",
               and_(health.c.state == "resting", health.c.rest_until_s <= now))


def _fence(lease: Lease) -> dict[str, Any]:
    return {"p_source": lease.source, "p_identity": lease.identity_id, "p_token": lease.fencing_token,
            "p_lease_id": lease.lease_id}



def _read_health(conn: Connection, identity_id: str, source: str) -> IdentityHealth | None:
    row = conn.execute(
        select(_H.c.state, _H.c.score, _H.c.rests, _H.c.rest_until_s, _H.c.flagged_at_s, _H.c.successes_in_row)
        .where(_H.c.identity_id == identity_id, _H.c.source == source)
    ).mappings().first()
    return IdentityHealth(**row) if row else None


def _health_row(identity_id: str, source: str, health: IdentityHealth, now: float) -> dict[str, Any]:
    return {"identity_id": identity_id, "source": source, "score": health.score, "state": health.state,
            "rests": health.rests, "rest_until_s": health.rest_until_s, "flagged_at_s": health.flagged_at_s,
            "successes_in_row": health.successes_in_row, "updated_at_s": now}


def _current(slot: Any, lease: Lease, now: float) -> bool:
    """Whether the lease row `slot` still holds `lease`: its fencing token and id, not released, not expired."""
    return not (slot is None or slot.fencing_token != lease.fencing_token or slot.lease_id != lease.lease_id
                or slot.released or slot.expires_at_s <= now)
