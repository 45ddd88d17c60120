"""The proxy resource names the identities a run goes out as, and gives back at the run's end every
lease the run still holds (only the run's own)."""

# No `from __future__ import annotations`: Dagster reads the asset parameters' annotations at definition.

from pathlib import Path

import pytest
from dagster import AssetExecutionContext, asset, build_init_resource_context, materialize

from investigations.identities import load_identities
from investigations.identities.pool import IdentityPool
from investigations.store import StateStore
from resources.fleet import FleetResource
from resources.identities import IdentityPoolResource

IDENTITIES = """
tiers: [datacenter]
identities:
  - {id: dc1_a, range: dc1, tier: datacenter}
  - {id: dc1_b, range: dc1, tier: datacenter}
"""


@pytest.fixture
def world(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "identities.yaml"
    path.write_text(IDENTITIES)
    return str(path), f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
def pool(world: tuple[str, str]):
    store = StateStore.from_url(world[1])
    pool = IdentityPool(store, load_identities(world[0]))
    pool.sync()
    yield pool
    pool.close()
    store.close()


def holders(pool: IdentityPool, source: str = "src") -> list[str]:
    """Who holds a lease for `source` now, read from the store."""
    return sorted(row["holder"] for row in pool.active_leases(source))


def test_give_back_releases_every_lease_of_the_run_and_only_those(world: tuple[str, str], pool: IdentityPool) -> None:
    for holder in ("run-1", "run-1", "run-2"):
        assert pool.acquire("src" if holder == "run-1" else "other", holder=holder, ttl_s=300) is not None
    assert pool.acquire("other", holder="run-1", ttl_s=300) is not None
    assert IdentityPoolResource(identities_path=world[0]).give_back(pool, run_id="run-1") == 3
    assert holders(pool, "src") == [] and holders(pool, "other") == ["run-2"]
    assert IdentityPoolResource(identities_path=world[0]).give_back(pool, run_id="run-1") == 0  # idempotent


def test_a_run_gives_back_the_leases_its_collections_left(world: tuple[str, str], pool: IdentityPool) -> None:
    seen: list[str] = []

    @asset
    def leaky(context: AssetExecutionContext, fleet: FleetResource) -> None:
        engine_pool = fleet.engine().pool
        assert engine_pool is not None
        # A collection thread abandoned past the run's end: its lease is still out when the step ends.
        lease = engine_pool.acquire("src", holder=context.run.run_id, ttl_s=3600)
        assert lease is not None
        seen.extend(holders(engine_pool))

    proxies = IdentityPoolResource(identities_path=world[0])
    result = materialize([leaky], resources={"fleet": FleetResource(database_url=world[1], identities=proxies),
                                             "identities": proxies})
    assert result.success
    assert seen == [result.run_id]
    assert holders(pool) == []  # back now, not in an hour


def test_the_fleet_goes_out_as_the_proxy_resource_s_identities_file(world: tuple[str, str], tmp_path: Path) -> None:
    proxies = IdentityPoolResource(identities_path=world[0])
    fleet = FleetResource(database_url=world[1], data_dir=str(tmp_path / "data"), identities=proxies)
    try:
        engine = fleet.engine()
        assert engine.pool is not None and engine.fetcher.pool is engine.pool
        assert sorted(engine.pool.catalog.ids) == ["dc1_a", "dc1_b"]
    finally:
        fleet.teardown_after_execution(build_init_resource_context())


def test_without_an_identities_file_the_fleet_goes_out_directly(world: tuple[str, str], tmp_path: Path) -> None:
    fleet = FleetResource(database_url=world[1], data_dir=str(tmp_path / "data"), identities=IdentityPoolResource())
    try:
        assert fleet.engine().pool is None
    finally:
        fleet.teardown_after_execution(build_init_resource_context())
