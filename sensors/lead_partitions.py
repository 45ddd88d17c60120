"""Leads join Dagster's `leads` partitions when they join the fleet, whatever path brought them.

The intake, `investigations leads add` and `leads import`, a case import and recurring crawls all
register leads in the state store's `leads` table; none of them talks to Dagster. The new-lead
sensor calls `sync_lead_partitions` at the start of each tick, which adds every lead registered since
its watermark to the partitions. So a backfill or a recurring batch finds its leads already there
(a batch run needs its leads to be partitions: it runs over a partition range), and the UI can
launch or backfill any lead. `ensure_partitions` is the backstop for a lead registered between the
sync and the dispatch of the same tick.

Only active leads stay partitions (`lifecycle_pass`, once a minute in the same tick, so a lead is
never synced and retired at once by two threads). A lead retires once no open case holds it,
nothing is owed to it and it has been left alone for `SETTLE` (a lead that no case ever held: for
the fleet's `retire_after`, registered for a backfill, say). Retiring removes the partition key
only: Dagster keeps its materializations and check results in the event log, and the state store
and the record store keep everything the fleet knows of it. A case re-opened, a new case that takes
the lead up, or a collection owed to it (a backfill, a requeued dead letter) adds the key again, and
its history is the partition's again. Why a lifecycle: docs/design.md, "A million leads".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from dagster import DagsterInstance
from sqlalchemy.exc import IntegrityError

from assets.partitions import LEADS_PARTITIONS
from investigations.store import StateStore, utcnow
from resources.dagster_internals import delete_partition_keys

# A lead's `created_at` is stamped before its transaction commits; re-reading this much before the
# watermark catches one committed late. Adding an existing partition is a no-op.
SYNC_OVERLAP = timedelta(seconds=60)
# Keys per add call: Dagster checks them against the partitions table in one `IN (...)` query.
ADD_CHUNK = 500
# Tries per chunk when another process adds some of its keys at the same moment.
ADD_ATTEMPTS = 3
# How long a lead that leaves every open case keeps its partition: a run of its may still be writing
# its materialization and checks, and a case closed by mistake is re-opened at no cost.
SETTLE = timedelta(minutes=5)
# Leads retired (and, separately, brought back) per pass, about 0.8 s on SQLite: a fleet that closes
# a big case retires it over a few passes, not in one long tick.
LIFECYCLE_BATCH = 20_000
# How often the new-lead sensor runs a lifecycle pass; while passes come back full it runs more of
# them, for up to this long per tick, and again at its next tick.
LIFECYCLE_EVERY_S = 60.0
LIFECYCLE_BUDGET_S = 3.0


def add_partitions(instance: DagsterInstance, keys: Iterable[str]) -> None:
    """Add `keys` to the `leads` partitions (idempotent), in chunks, in the order given.

    Dagster reads which keys exist, then inserts the others: two ticks adding the same new lead at
    once (the primary's sync and a relay's dispatch, say) race between the two, and the slower one
    meets the unique constraint. It adds again, and this time finds the key there."""
    keys = list(dict.fromkeys(keys))
    for start in range(0, len(keys), ADD_CHUNK):
        chunk = keys[start:start + ADD_CHUNK]
        for attempt in range(ADD_ATTEMPTS):
            try:
                instance.add_dynamic_partitions(LEADS_PARTITIONS, chunk)
                break
            except IntegrityError:
                if attempt == ADD_ATTEMPTS - 1:
                    raise


def sync_lead_partitions(instance: DagsterInstance, store: StateStore, *, since: datetime | None,
                         now: datetime | None = None) -> tuple[int, datetime]:
    """Add the leads registered since `since` (all of them when None: a first tick, or a new Dagster
    instance over an existing state store); return how many were read and the next watermark."""
    now = now or utcnow()
    keys = store.partition_keys_since(since - SYNC_OVERLAP if since else None)
    add_partitions(instance, keys)
    return len(keys), now


def ensure_partitions(instance: DagsterInstance, keys: Iterable[str], known: Mapping[str, int]) -> list[str]:
    """Add whichever of `keys` are not `known` partitions yet; return them."""
    missing = [key for key in dict.fromkeys(keys) if key not in known]
    add_partitions(instance, missing)
    return missing


@dataclass(frozen=True)
class LifecycleResult:
    """What one lifecycle pass changed in the `leads` partitions, by lead id."""

    revived: list[str]
    retired: list[str]

    @property
    def changed(self) -> bool:
        return bool(self.revived or self.retired)


def lifecycle_pass(instance: DagsterInstance, store: StateStore, *, retire_after: timedelta,
                   now: datetime | None = None, batch: int = LIFECYCLE_BATCH) -> LifecycleResult:
    """Bring back the retired leads that are active again, then retire the leads that are not, at
    most `batch` of each. Dagster is changed before the state store records it, so a pass cut short
    is finished by the next one (adding and removing a key are both idempotent)."""
    now = now or utcnow()
    revived = store.leads_to_revive(limit=batch)
    if revived:
        add_partitions(instance, revived.values())
        store.mark_active(list(revived))
    retired = store.leads_to_retire(settled_before=now - SETTLE, idle_before=now - retire_after, limit=batch)
    if retired:
        delete_partition_keys(instance, LEADS_PARTITIONS, list(retired.values()))
        store.mark_retired(list(retired), now=now)
    return LifecycleResult(revived=list(revived), retired=list(retired))
