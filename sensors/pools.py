"""Keep the instance's pool limits in step with each source's spec in sources.yaml.

A source's pool holds its background runs (as many as its rate needs, see
`investigations.scheduling.dispatch.background_runs_for`) plus `interactive_slots` that only interactive work
can count on: the dispatcher never hands a source more background runs than that, so fresh leads
find the pool open even while the source's batches run, instead of waiting behind a 90 s batch. The source's rate lane, not the pool, keeps the
requests within what the source allows.

Dagster keeps pool limits in the instance, not in code. The new-lead sensor calls this before it
requests runs, so a limit edited in sources.yaml takes effect on the next tick, and no source run
is ever queued against the instance default (see dagster.yaml `concurrency.pools.default_limit`).
"""

from __future__ import annotations

from dagster import DagsterInstance

from assets.naming import pool_name
from investigations.scheduling.dispatch import background_runs_for
from investigations.sources.specs import SourceCatalog, SourceSpec


def pool_limit(spec: SourceSpec) -> int:
    """The source pool's limit: its background runs, plus the slots kept for interactive runs."""
    return background_runs_for(spec) + spec.interactive_slots


def sync_pool_limits(instance: DagsterInstance, catalog: SourceCatalog) -> dict[str, int]:
    """Set every source pool's limit that differs from its spec; return what was changed."""
    storage = instance.event_log_storage
    current = {limit.name: limit.limit for limit in storage.get_pool_limits() if not limit.from_default}
    changed: dict[str, int] = {}
    for spec in catalog.sources:
        pool = pool_name(spec.name)
        limit = pool_limit(spec)
        if current.get(pool) != limit:
            storage.set_concurrency_slots(pool, limit)
            changed[pool] = limit
    return changed
