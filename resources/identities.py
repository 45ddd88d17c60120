"""The proxy resource: which identities a run's requests go out as, and the run's hold on them."""

from __future__ import annotations

import logging

from dagster import ConfigurableResource

from investigations.identities import IdentityPool

log = logging.getLogger(__name__)


class IdentityPoolResource(ConfigurableResource):
    """Identities (proxy + cookies + fingerprint), leased per source from the pool every run and
    process shares through the state store. `identities_path` (else `INVESTIGATIONS_IDENTITIES`)
    names the identities file; without one, requests go out directly as the `direct` identity.

    The run's engine (`FleetResource`'s, built by `investigations.composition.open_engine`, the one
    place a pool is built) holds the pool; every collection leases from it under the run's id and
    gives its lease back in `finally`, whatever happens (`investigations.identities.leasing`). When
    the run ends, `give_back` returns whatever it still holds (a collection thread abandoned past
    the run's end), so those identities go back to work now rather than when their leases expire.
    A process killed before either still loses its leases when their TTL runs out.
    """

    identities_path: str | None = None

    def give_back(self, pool: IdentityPool, *, run_id: str) -> int:
        """Release every lease the run `run_id` still holds in `pool`; how many there were."""
        released = pool.release_held_by(run_id)
        if released:
            log.warning("gave back %d identity lease(s) the run still held at its end: run_id=%s", released, run_id)
        return released
