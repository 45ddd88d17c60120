"""Leads join Dagster's `leads` partitions when they join the fleet, whatever path brought them.

The intake, `investigations leads add` and `leads import`, a case import and recurring crawls all
register leads in the state store's `leads` table; none of them talks to Dagster. The new-lead
sensor calls `sync_lead_partitions` at the start of each tick, which adds every lead registered since
its watermark to the partitions. So a backfill or a recurring batch finds its leads already there
(a batch run needs its leads to be partitions: it runs over a partition range), and the UI can
launch or backfill any lead. `ensure_partitions` is the backstop for a lead registered between the
sync and the dispatch of the same tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from dagster import DagsterInstance

from assets.partitions import LEADS_PARTITIONS
from investigations.store import StateStore, utcnow

# A lead's `created_at` is stamped before its transaction commits; re-reading this much before the
# watermark catches one committed late. Adding an existing partition is a no-op.
SYNC_OVERLAP = timedelta(seconds=60)
# Keys per add call: Dagster checks them against the partitions table in one `IN (...)` query.
ADD_CHUNK = 500


def add_partitions(instance: DagsterInstance, keys: Iterable[str]) -> None:
    """Add `keys` to the `leads` partitions (idempotent), in chunks, in the order given."""
    keys = list(dict.fromkeys(keys))
    for start in range(0, len(keys), ADD_CHUNK):
        instance.add_dynamic_partitions(LEADS_PARTITIONS, keys[start:start + ADD_CHUNK])


def sync_lead_partitions(instance: DagsterInstance, store: StateStore, *, since: datetime | None,
                         now: datetime | None = None) -> tuple[int, datetime]:
    """Add the leads registered since `since` (all of them when None: a first tick, or a new Dagster
    instance over an existing state store); return how many were read and the next watermark."""
    now = now or utcnow()
    keys = store.lead_ids_since(since - SYNC_OVERLAP if since else None)
    add_partitions(instance, keys)
    return len(keys), now


def ensure_partitions(instance: DagsterInstance, keys: Iterable[str], known: Mapping[str, int]) -> list[str]:
    """Add whichever of `keys` are not `known` partitions yet; return them."""
    missing = [key for key in dict.fromkeys(keys) if key not in known]
    add_partitions(instance, missing)
    return missing
