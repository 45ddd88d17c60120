"""The proxy resource gives every lease back: when the `lease()` block ends, however it ends, and
at teardown for a lease a step left out."""

# No `from __future__ import annotations`: Dagster reads the asset parameters' annotations at definition.

from pathlib import Path

import httpx
import pytest
from dagster import AssetExecutionContext, asset, build_init_resource_context, materialize

from investigations.identities import IdentityUnavailable, load_identities
from investigations.identities.pool import IdentityPool
from investigations.store import StateStore
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


def leased(world: tuple[str, str], source: str = "src") -> list[str]:
    """Identities currently leased for `source`, read straight from the store."""
    path, url = world
    store = StateStore.from_url(url)
    pool = IdentityPool(store, load_identities(path))
    try:
        return [row["identity_id"] for row in pool.active_leases(source)]
    finally:
        pool.close()
        store.close()


def test_a_lease_is_released_when_its_block_ends(world: tuple[str, str]) -> None:
    resource = IdentityPoolResource(identities_path=world[0], database_url=world[1])
    with resource.lease("src", holder="run-1") as lease:
        assert leased(world) == [lease.identity_id]
    assert leased(world) == []
    resource.teardown_after_execution(build_init_resource_context())


def test_a_lease_is_released_when_its_block_raises(world: tuple[str, str]) -> None:
    resource = IdentityPoolResource(identities_path=world[0], database_url=world[1])
    with pytest.raises(RuntimeError, match="boom"), resource.lease("src", holder="run-1"):
        raise RuntimeError("boom")
    assert leased(world) == [] and resource.held() == []
    resource.teardown_after_execution(build_init_resource_context())


def test_teardown_releases_a_lease_still_held(world: tuple[str, str]) -> None:
    resource = IdentityPoolResource(identities_path=world[0], database_url=world[1])
    block = resource.lease("src", holder="run-1")
    lease = block.__enter__()  # a step that never got to leave its block
    assert leased(world) == [lease.identity_id]
    resource.teardown_after_execution(build_init_resource_context())
    assert leased(world) == []


def test_no_identity_free_raises_identity_unavailable(world: tuple[str, str]) -> None:
    resource = IdentityPoolResource(identities_path=world[0], database_url=world[1])
    with (resource.lease("src", holder="a"), resource.lease("src", holder="b"),
          pytest.raises(IdentityUnavailable, match="src"), resource.lease("src", holder="c")):
        pass
    resource.teardown_after_execution(build_init_resource_context())


def test_a_run_gives_back_every_lease_its_step_took(world: tuple[str, str]) -> None:
    seen: list[str] = []

    @asset
    def leaky(context: AssetExecutionContext, identities: IdentityPoolResource) -> None:
        with identities.lease("src", holder=context.run.run_id) as lease:
            seen.append(lease.identity_id)
        seen.append(identities.lease("src", holder=context.run.run_id).__enter__().identity_id)  # never left

    result = materialize([leaky], resources={"identities": IdentityPoolResource(identities_path=world[0],
                                                                                   database_url=world[1])})
    assert result.success
    assert len(seen) == 2
    assert leased(world) == []


def test_without_an_identities_file_the_resource_leases_the_direct_identity(tmp_path: Path) -> None:
    resource = IdentityPoolResource(database_url=f"sqlite:///{tmp_path / 'state.db'}")
    with resource.lease("src", holder="run-1") as lease:
        assert (lease.identity_id, lease.identity.proxy()) == ("direct", None)
    resource.teardown_after_execution(build_init_resource_context())


def test_the_resource_hands_out_the_cookie_jars_of_its_store(world: tuple[str, str]) -> None:
    resource = IdentityPoolResource(identities_path=world[0], database_url=world[1])
    resource.cookies.save("dc1_a", httpx.Cookies({"sid": "abc"}))
    assert dict(resource.cookies.load("dc1_a")) == {"sid": "abc"}
    resource.teardown_after_execution(build_init_resource_context())
