"""Keep the instance's pool limits equal to each source's `concurrency` in sources.yaml.

Dagster keeps pool limits in the instance, not in code. The new-lead sensor calls this before it
requests runs, so a limit edited in sources.yaml takes effect on the next tick, and no source run
is ever queued against the instance default (see dagster.yaml `concurrency.pools.default_limit`).
"""

from __future__ import annotations

from dagster import DagsterInstance

from assets.naming import pool_name
from investigations.specs import SourceCatalog


def sync_pool_limits(instance: DagsterInstance, catalog: SourceCatalog) -> dict[str, int]:
    """Set every source pool's limit that differs from its spec; return what was changed."""
    storage = instance.event_log_storage
    current = {limit.name: limit.limit for limit in storage.get_pool_limits() if not limit.from_default}
    changed: dict[str, int] = {}
    for spec in catalog.sources:
        pool = pool_name(spec.name)
        if current.get(pool) != spec.concurrency:
            storage.set_concurrency_slots(pool, spec.concurrency)
            changed[pool] = spec.concurrency
    return changed
