"""How a collection holds identities: its lease is given back however the collection ends; a pool
leased out by others is waited for, then the collection is told to wait (NoIdentity); a blocked
identity is switched for another, up to the limit (IdentitiesSpent); and every lease-length rule,
the dispatcher's too, comes from here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from investigations.identities import IdentityPool, parse_identities
from investigations.identities.leasing import (
    LEASE_WAIT_S,
    IdentitiesSpent,
    Leasing,
    NoIdentity,
    lease_ttl_s,
    longest_hold_s,
)
from investigations.identities.sessions import IdentityBlocked, Sessions
from investigations.sources.specs import load_sources
from investigations.store import StateStore
from tests.fakes import FakeTime

ROOT = Path(__file__).resolve().parents[3]
SPEC = load_sources(ROOT / "sources.yaml").get("robust")
IDENTITIES = """
tiers: [datacenter]
identities:
  - {id: dc1_a, range: dc1, tier: datacenter}
  - {id: dc1_b, range: dc1, tier: datacenter}
"""


@pytest.fixture
def pool(sqlite_store: StateStore) -> Iterator[IdentityPool]:
    pool = IdentityPool(sqlite_store, parse_identities(IDENTITIES))
    pool.sync()
    yield pool
    pool.close()


def _leasing(pool: IdentityPool | None, time: FakeTime, **kwargs: float) -> Leasing:
    sessions = Sessions(pool=pool, user_agent="test")
    return Leasing(sessions, None, clock=time.clock, sleep=time.sleep, **kwargs)  # type: ignore[arg-type]


def _holders(pool: IdentityPool) -> list[str]:
    return sorted(row["holder"] for row in pool.active_leases(SPEC.name))


def test_a_collection_holds_one_identity_and_gives_it_back_when_it_raises(pool: IdentityPool) -> None:
    leasing = _leasing(pool, FakeTime())
    with pytest.raises(RuntimeError, match="boom"), leasing.held(SPEC, "lead-1", holder="run-1") as identities:
        assert identities.current().identity_id in {"dc1_a", "dc1_b"}
        assert _holders(pool) == ["run-1"]
        raise RuntimeError("boom")
    assert _holders(pool) == []


def test_without_a_pool_the_collection_goes_out_as_the_direct_identity() -> None:
    with _leasing(None, FakeTime()).held(SPEC, "lead-1", holder="run-1") as identities:
        assert (identities.current().identity_id, identities.identity_ids) == ("direct", ["direct"])


def test_a_pool_leased_out_by_others_is_waited_for_then_the_collection_is_told_to_wait(pool: IdentityPool) -> None:
    for holder in ("other-1", "other-2"):
        assert pool.acquire(SPEC.name, holder=holder, ttl_s=600) is not None
    time = FakeTime()
    with pytest.raises(NoIdentity, match="leased by other collections") as none, \
            _leasing(pool, time, lease_wait_s=5.0, no_identity_retry_s=15.0).held(SPEC, "lead-1", holder="run-1"):
        pass
    assert none.value.retry_in_s == 15.0
    assert 5.0 <= time.now < 5.5  # it waited its lease_wait_s, polling, before giving up


def test_a_blocked_identity_is_switched_for_another_until_the_limit(pool: IdentityPool) -> None:
    leasing = _leasing(pool, FakeTime(), max_identities=2)
    with leasing.held(SPEC, "lead-1", holder="run-1") as identities:
        first = identities.current().identity_id
        identities.switch(IdentityBlocked(first, 403, 1, "a block page"))
        second = identities.current().identity_id
        assert second != first and identities.identity_ids == [first, second]
        with pytest.raises(IdentitiesSpent, match="2 identities blocked in turn") as spent:
            identities.switch(IdentityBlocked(second, 403, 1, "a block page"))
        assert spent.value.last_status == 403
    assert _holders(pool) == []


def test_a_blocked_identity_with_no_other_free_makes_the_collection_wait(pool: IdentityPool) -> None:
    leasing = _leasing(pool, FakeTime())
    with leasing.held(SPEC, "lead-1", holder="run-1") as identities:
        assert pool.acquire(SPEC.name, holder="other", ttl_s=600) is not None  # the other one goes elsewhere
        session = identities.current()
        assert session.lease is not None
        pool.report(session.lease, "identity_fault", status=403)  # the pool sends it to rest, as a block does
        with pytest.raises(NoIdentity, match="blocked, no other available"):
            identities.switch(IdentityBlocked(session.identity_id, 403, 1, "a block page"))


def test_the_longest_hold_is_the_wait_for_a_lease_plus_its_whole_life() -> None:
    attempts_s = SPEC.retry.attempts * (SPEC.timeout_s + SPEC.retry.max_delay_s)
    assert lease_ttl_s(SPEC) > attempts_s + SPEC.throttle.park_after_s
    assert longest_hold_s(SPEC) == lease_ttl_s(SPEC) + LEASE_WAIT_S
