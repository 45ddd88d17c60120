"""The identity pool on SQLite and Postgres: leases (one per identity and source, LRU, TTL,
fencing), health written back under a live lease only, resting identities and ranges, tiers."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace

import pytest
from pydantic import SecretStr

from investigations.identities import HealthPolicy, IdentityCatalog, IdentityPool, IdentitySpec
from investigations.identities.pool import Lease, identity_lane_name
from investigations.pacing import GapSampler, RateLanes
from investigations.pacing.lanes import LaneSpec, identity_lane
from investigations.store import StateStore
from tests.fakes import FakeClock, runs_without_the_write_lock

NOW = 1_000_000.0
TTL_S = 30.0
REST_S = 300.0  # the first rest under the default policy, with the jitter pinned to its middle


class Fixed(random.Random):
    def random(self) -> float:
        return 0.5  # no jitter: rests are exactly base x 2^rests


def ident(identity_id: str, range_name: str, tier: str = "datacenter", proxy: str | None = None) -> IdentitySpec:
    return IdentitySpec(id=identity_id, range=range_name, tier=tier, proxy_url=SecretStr(proxy) if proxy else None)


FLEET = IdentityCatalog(
    tiers=("datacenter", "residential"),
    identities=(
        ident("dc1_a", "dc1", proxy="http://fleet:hunter2@dc1.example.net:8001"),
        ident("dc1_b", "dc1"),
        ident("dc1_c", "dc1"),
        ident("dc2_a", "dc2"),
        ident("res_a", "res", "residential"),
    ),
)
DATACENTER = [i.id for i in FLEET.identities if i.tier == "datacenter"]


def only(*identities: IdentitySpec) -> IdentityCatalog:
    return IdentityCatalog(tiers=("datacenter", "residential"), identities=identities)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def make_pool(store: StateStore, clock: FakeClock):
    pools: list[IdentityPool] = []

    def make(catalog: IdentityCatalog = FLEET, **policy: float) -> IdentityPool:
        pool = IdentityPool(store, catalog, policy=HealthPolicy(**policy), clock=clock, rng=Fixed())  # type: ignore[arg-type]
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.fixture
def pool(make_pool) -> IdentityPool:
    return make_pool()


def take(pool: IdentityPool, source: str = "src", *, holder: str = "run-1", ttl_s: float = TTL_S) -> Lease:
    lease = pool.acquire(source, holder=holder, ttl_s=ttl_s)
    assert lease is not None, f"nothing free for {source}"
    return lease


def block(pool: IdentityPool, identity_id: str, source: str = "src") -> None:
    """Lease `identity_id` at `source` (leasing and releasing others on the way) and report a 403."""
    others = []
    for _ in range(len(pool.catalog.identities)):
        lease = take(pool, source)
        if lease.identity_id == identity_id:
            assert pool.report(lease, "identity_fault", status=403)
            pool.release(lease)
            break
        others.append(lease)
    else:
        raise AssertionError(f"{identity_id} never came up at {source}")
    for lease in others:
        pool.release(lease)


# -- leases -----------------------------------------------------------------------------------------


def test_acquire_leases_an_identity_of_the_cheapest_tier_with_a_first_fencing_token(pool: IdentityPool) -> None:
    lease = take(pool)
    assert lease.identity_id in DATACENTER
    assert (lease.source, lease.fencing_token, lease.expires_at_s, lease.holder) == ("src", 1, NOW + TTL_S, "run-1")
    assert lease.identity.id == lease.identity_id


def test_a_lease_never_shows_the_proxy_credentials(pool: IdentityPool) -> None:
    lease = take(pool)
    assert lease.identity_id == "dc1_a"
    assert "hunter2" not in repr(lease) and "hunter2" not in str(lease)
    assert lease.identity.proxy() == "http://fleet:hunter2@dc1.example.net:8001"


def test_an_identity_is_leased_once_per_source_at_a_time(pool: IdentityPool) -> None:
    leases = [take(pool) for _ in DATACENTER]
    assert sorted(lease.identity_id for lease in leases) == sorted(DATACENTER)
    # All busy, none blocked: wait for one rather than pay for the residential tier.
    assert pool.acquire("src", holder="run-2", ttl_s=TTL_S) is None


def test_the_same_identity_may_be_leased_for_two_sources_at_once(make_pool) -> None:
    pool = make_pool(only(ident("solo", "r")))
    assert (take(pool, "alpha").identity_id, take(pool, "beta").identity_id) == ("solo", "solo")
    assert pool.acquire("alpha", holder="run-2", ttl_s=TTL_S) is None


def test_the_least_recently_leased_identity_goes_first(pool: IdentityPool, clock: FakeClock) -> None:
    order = []
    for _ in range(len(DATACENTER) + 2):
        lease = take(pool)
        order.append(lease.identity_id)
        pool.release(lease)
        clock.now += 1
    assert order == [*DATACENTER, *DATACENTER[:2]]


def test_a_killed_holders_lease_comes_back_when_its_ttl_runs_out(make_pool, clock: FakeClock) -> None:
    pool = make_pool(only(ident("solo", "r")))
    first = take(pool, holder="killed-run")  # never released: the run died
    clock.now += TTL_S - 1
    assert pool.acquire("src", holder="run-2", ttl_s=TTL_S) is None
    clock.now += 1
    second = take(pool, holder="run-2")
    assert (second.identity_id, second.fencing_token) == ("solo", first.fencing_token + 1)


def test_an_expired_holder_cannot_write_health_once_the_identity_was_taken_over(
    make_pool, clock: FakeClock
) -> None:
    pool = make_pool(only(ident("solo", "r")))
    stale = take(pool, holder="slow-run")
    clock.now += TTL_S + 1
    current = take(pool, holder="run-2")
    assert pool.report(stale, "identity_fault", status=403) is False
    assert pool.health("solo", "src") is None
    assert pool.report(current, "identity_fault", status=403) is True
    assert pool.health("solo", "src").state == "resting"  # type: ignore[union-attr]


def test_a_report_after_expiry_is_refused_even_before_anyone_takes_over(pool: IdentityPool, clock: FakeClock) -> None:
    lease = take(pool)
    clock.now += TTL_S
    assert pool.report(lease, "ok", status=200) is False


def test_a_clean_identity_s_success_is_read_not_written(sqlite_store: StateStore, clock: FakeClock) -> None:
    """Every answer reports; a success of an identity with no score and no rest to forgive changes
    nothing, so it does not wait for SQLite's one writer. A success after a failure repays half a
    point, and is written."""
    pool = IdentityPool(sqlite_store, FLEET, clock=clock, rng=Fixed())  # type: ignore[arg-type]
    try:
        lease = take(pool)
        assert pool.report(lease, "ok", status=200)
        assert runs_without_the_write_lock(sqlite_store, lambda: pool.report(lease, "ok", status=200))
        assert pool.report(lease, "identity_fault", status=429)
        assert not runs_without_the_write_lock(sqlite_store, lambda: pool.report(lease, "ok", status=200),
                                               wait_s=1.0)
        health = pool.health(lease.identity_id, "src")
        assert health is not None and health.score == pytest.approx(0.5)
    finally:
        pool.close()


def test_a_released_lease_cannot_report(pool: IdentityPool) -> None:
    lease = take(pool)
    pool.release(lease)
    assert pool.report(lease, "identity_fault", status=403) is False
    assert pool.health(lease.identity_id, "src") is None


def test_release_is_idempotent(pool: IdentityPool) -> None:
    lease = take(pool)
    assert (pool.release(lease), pool.release(lease)) == (True, False)


def test_a_release_by_a_stale_holder_does_not_free_its_successors_lease(make_pool, clock: FakeClock) -> None:
    pool = make_pool(only(ident("solo", "r")))
    stale = take(pool)
    clock.now += TTL_S
    current = take(pool, holder="run-2")
    assert pool.release(stale) is False
    assert pool.acquire("src", holder="run-3", ttl_s=TTL_S) is None
    assert pool.report(current, "ok", status=200) is True


def test_heartbeat_extends_a_live_lease(pool: IdentityPool, clock: FakeClock) -> None:
    lease = take(pool)
    clock.now += TTL_S - 1
    extended = pool.heartbeat(lease)
    assert extended is not None and extended.expires_at_s == clock.now + TTL_S
    clock.now += TTL_S - 1
    assert pool.report(extended, "ok", status=200) is True


def test_heartbeat_of_an_expired_lease_says_it_was_lost(pool: IdentityPool, clock: FakeClock) -> None:
    lease = take(pool)
    clock.now += TTL_S
    assert pool.heartbeat(lease) is None


def test_eight_threads_acquiring_at_once_never_get_the_same_identity_for_a_source(make_pool) -> None:
    pool = make_pool(only(*(ident(f"dc_{n}", f"r{n % 3}") for n in range(10))))
    pool.release(take(pool))  # registry and lease slots exist before the race
    holding: dict[tuple[str, str], str] = {}
    guard = threading.Lock()
    clashes: list[str] = []
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        for _ in range(25):
            lease = pool.acquire("src" if n % 2 else "other", holder=f"t{n}", ttl_s=TTL_S)
            if lease is None:
                continue
            key = (lease.source, lease.identity_id)
            with guard:
                if key in holding:
                    clashes.append(f"{key} held by {holding[key]} and t{n}")
                holding[key] = f"t{n}"
            with guard:
                del holding[key]
            pool.release(lease)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clashes == []


def test_eight_threads_leasing_at_once_each_get_a_distinct_identity(make_pool) -> None:
    pool = make_pool(only(*(ident(f"dc_{n}", f"r{n % 3}") for n in range(8))))
    pool.release(take(pool))
    got: list[str | None] = [None] * 8
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        lease = pool.acquire("src", holder=f"t{n}", ttl_s=TTL_S)
        got[n] = lease.identity_id if lease else None

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(i for i in got if i) == sorted(f"dc_{n}" for n in range(8))


# -- health -----------------------------------------------------------------------------------------


def test_a_blocked_identity_rests_and_is_skipped_until_its_rest_is_over(make_pool, clock: FakeClock) -> None:
    pool = make_pool(only(ident("dc1_a", "dc1"), ident("dc2_a", "dc2")))
    block(pool, "dc1_a")
    for _ in range(3):
        lease = take(pool)
        assert lease.identity_id == "dc2_a"
        pool.release(lease)
    clock.now += REST_S
    assert {take(pool).identity_id, take(pool).identity_id} == {"dc1_a", "dc2_a"}


def test_plain_failures_rest_an_identity_only_at_the_limit(make_pool) -> None:
    pool = make_pool(only(ident("solo", "r")))
    lease = take(pool)
    assert [pool.report(lease, "identity_fault", status=429) for _ in range(2)] == [True, True]
    assert pool.health("solo", "src").state == "healthy"  # type: ignore[union-attr]
    pool.report(lease, "identity_fault", status=429)
    assert pool.health("solo", "src").state == "resting"  # type: ignore[union-attr]


def test_a_source_fault_leaves_the_identity_alone(pool: IdentityPool) -> None:
    lease = take(pool)
    for _ in range(5):
        assert pool.report(lease, "source_fault", status=503) is True
    assert pool.health(lease.identity_id, "src") is None


def test_health_is_kept_per_source(make_pool) -> None:
    pool = make_pool(only(ident("solo", "r")))
    block(pool, "solo", "alpha")
    assert pool.acquire("alpha", holder="run-2", ttl_s=TTL_S) is None
    assert take(pool, "beta").identity_id == "solo"


def test_an_identity_is_retired_after_repeated_rests(make_pool, clock: FakeClock) -> None:
    pool = make_pool(only(ident("solo", "r"), ident("other", "r2")), retire_after_rests=1)
    block(pool, "solo")
    clock.now += REST_S
    block(pool, "solo")
    assert pool.health("solo", "src").state == "retired"  # type: ignore[union-attr]
    clock.now += 365 * 86400
    assert {take(pool).identity_id for _ in range(1)} == {"other"}
    assert pool.acquire("src", holder="run-2", ttl_s=TTL_S) is None


def test_a_range_rests_at_a_source_after_two_of_its_identities_are_flagged(pool: IdentityPool) -> None:
    block(pool, "dc1_a")
    block(pool, "dc1_b")
    assert pool.range_rest_until_s("dc1", "src") == NOW + REST_S
    offered = set()
    for _ in range(4):
        lease = pool.acquire("src", holder="run-2", ttl_s=TTL_S)
        if lease:
            offered.add(lease.identity_id)
            pool.release(lease)
    assert offered == {"dc2_a"}  # dc1_c is healthy, but its range is resting here


def test_a_resting_range_is_served_again_at_other_sources_and_after_its_rest(pool: IdentityPool, clock: FakeClock) -> None:
    block(pool, "dc1_a")
    block(pool, "dc1_b")
    assert take(pool, "elsewhere").identity_id == "dc1_a"
    clock.now += REST_S
    assert "dc1_c" in {take(pool).identity_id for _ in range(4)}


def test_one_flagged_identity_does_not_rest_its_range(pool: IdentityPool) -> None:
    block(pool, "dc1_a")
    assert pool.range_rest_until_s("dc1", "src") is None
    assert {take(pool).identity_id for _ in range(3)} == {"dc1_b", "dc1_c", "dc2_a"}


def test_two_identities_of_a_range_flagged_at_the_same_moment_rest_the_range(pool: IdentityPool) -> None:
    leases = [take(pool), take(pool)]
    assert [lease.identity_id for lease in leases] == ["dc1_a", "dc1_b"]
    start = threading.Barrier(2)

    def flag(lease: Lease) -> None:
        start.wait()
        pool.report(lease, "identity_fault", status=403)

    threads = [threading.Thread(target=flag, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert pool.range_rest_until_s("dc1", "src") == NOW + REST_S


def test_flags_further_apart_than_the_window_do_not_rest_the_range(pool: IdentityPool, clock: FakeClock) -> None:
    block(pool, "dc1_a")
    clock.now += 601
    block(pool, "dc1_b")
    assert pool.range_rest_until_s("dc1", "src") is None


# -- tiers ------------------------------------------------------------------------------------------


def test_the_source_escalates_to_residential_only_once_datacenter_is_blocked_there(pool: IdentityPool) -> None:
    block(pool, "dc2_a")
    lease = take(pool)
    assert lease.identity.tier == "datacenter"  # dc1 is still healthy here
    pool.release(lease)
    block(pool, "dc1_a")
    block(pool, "dc1_b")  # the dc1 range rests: no datacenter identity left at src
    lease = take(pool)
    assert (lease.identity_id, pool.current_tier("src")) == ("res_a", "residential")


def test_escalation_is_per_source(pool: IdentityPool) -> None:
    for identity_id in ("dc2_a", "dc1_a", "dc1_b"):
        block(pool, identity_id)
    assert take(pool).identity_id == "res_a"
    other = take(pool, "other")
    assert (other.identity.tier, pool.current_tier("other")) == ("datacenter", "datacenter")


def test_an_escalated_source_steps_down_after_a_run_of_successes(make_pool, clock: FakeClock) -> None:
    pool = make_pool(only(ident("dc", "dc"), ident("res", "res", "residential")), step_down_after_successes=3)
    block(pool, "dc")
    lease = take(pool, ttl_s=2 * REST_S)
    assert lease.identity_id == "res"
    clock.now += REST_S  # the datacenter identity is back, but the source stays escalated ...
    assert pool.current_tier("src") == "residential"
    assert [pool.report(lease, "ok", status=200) for _ in range(2)] == [True, True]
    assert pool.current_tier("src") == "residential"
    pool.report(lease, "ok", status=200)  # ... until its third success in a row
    assert pool.current_tier("src") == "datacenter"
    pool.release(lease)
    assert take(pool).identity_id == "dc"


def test_a_failure_on_the_escalated_tier_restarts_the_run(make_pool) -> None:
    pool = make_pool(only(ident("dc", "dc"), ident("res", "res", "residential")), step_down_after_successes=3)
    block(pool, "dc")
    lease = take(pool)
    pool.report(lease, "ok", status=200)
    pool.report(lease, "ok", status=200)
    pool.report(lease, "identity_fault", status=429)
    pool.report(lease, "ok", status=200)
    pool.report(lease, "ok", status=200)
    assert pool.current_tier("src") == "residential"


def test_min_tier_starts_a_source_on_a_costlier_tier(pool: IdentityPool) -> None:
    lease = pool.acquire("src", holder="run-1", ttl_s=TTL_S, min_tier="residential")
    assert lease is not None and lease.identity_id == "res_a"


# -- lanes and the registry -------------------------------------------------------------------------


def test_the_lane_name_is_the_one_pacing_uses() -> None:
    spec = SimpleNamespace(name="src", rate=SimpleNamespace(identity_per_s=1.0, identity_burst=1))
    assert identity_lane_name("src", "dc1_a") == identity_lane(spec, "dc1_a").name  # type: ignore[arg-type]


def test_an_identity_whose_lane_is_booked_ahead_is_skipped_when_lanes_are_given(
    store: StateStore, make_pool, clock: FakeClock
) -> None:
    pool = make_pool(only(ident("dc1_a", "dc1"), ident("dc2_a", "dc2")))
    lanes = RateLanes(store, sampler=GapSampler(random.Random(0), sigma=0.0, pause_probability=0.0),
                      clock=clock)
    lanes.reserve([LaneSpec(identity_lane_name("src", "dc1_a"), rate_per_s=0.1, burst=1)], max_wait_s=60)
    picks = set()
    for _ in range(2):
        lease = pool.acquire("src", holder="run-1", ttl_s=TTL_S, lanes=lanes)
        assert lease is not None
        picks.add(lease.identity_id)
        pool.release(lease)
    assert picks == {"dc2_a"}
    assert take(pool).identity_id == "dc1_a"  # without lanes it is next in LRU order


def test_identities_dropped_from_the_file_are_no_longer_leased(make_pool) -> None:
    before = make_pool(only(ident("keep", "r"), ident("drop", "r")))
    before.release(take(before))
    after = make_pool(only(ident("keep", "r")))
    after.sync()
    assert take(after).identity_id == "keep"
    assert after.acquire("src", holder="run-2", ttl_s=TTL_S) is None


def test_a_lease_given_back_wakes_a_collection_waiting_in_the_same_process(pool: IdentityPool) -> None:
    import threading
    import time

    lease = take(pool)
    woke_after: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        pool.wait_for_release(5.0)
        woke_after.append(time.monotonic() - started)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    assert pool.release(lease)
    waiter.join(timeout=5)
    assert woke_after and woke_after[0] < 1.0
