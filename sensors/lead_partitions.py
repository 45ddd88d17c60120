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

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from dagster import DagsterInstance, serialize_value
from sqlalchemy.exc import IntegrityError

from assets.partitions import LEADS_PARTITIONS
from investigations.store import StateStore, utcnow
from resources.dagster_internals import (
    InstanceRef,
    carry_partition_status,
    delete_partition_keys,
    existing_partition_keys,
)

logger = logging.getLogger(__name__)

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


def add_partitions(instance: DagsterInstance, keys: Iterable[str]) -> list[str]:
    """Add `keys` to the `leads` partitions (idempotent), in chunks, in the order given; return
    those that were not partitions yet, whose sources' partition status is then carried over to the
    new keys in the background (`carry_status_soon`).

    Dagster reads which keys exist, then inserts the others: two ticks adding the same new lead at
    once (the primary's sync and a relay's dispatch, say) race between the two, and the slower one
    meets the unique constraint. It adds again, and this time finds the key there."""
    keys = list(dict.fromkeys(keys))
    added: list[str] = []
    for start in range(0, len(keys), ADD_CHUNK):
        chunk = keys[start:start + ADD_CHUNK]
        for attempt in range(ADD_ATTEMPTS):
            try:
                existing = existing_partition_keys(instance, LEADS_PARTITIONS, chunk)
                new = [key for key in chunk if key not in existing]
                if new:
                    instance.add_dynamic_partitions(LEADS_PARTITIONS, new)
                added.extend(new)
                break
            except IntegrityError:
                if attempt == ADD_ATTEMPTS - 1:
                    raise
    if added:
        carry_status_soon(instance, added)
    return added


class _Carrier:
    """Carries the sources' partition status over to added keys (`carry_partition_status`) in a
    thread of its own, so the tick that added them (a fresh lead's, which an investigator waits on)
    does not wait for it: about a read of every key and a query per source. Keys added while a carry
    runs are taken by the next; where a carry found no status to move and more keys came meanwhile,
    its keys go with those (the status may have been made before both). Keys are kept per Dagster
    instance they were added to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[InstanceRef, set[str]]] = {}
        self._thread: threading.Thread | None = None

    def add(self, instance: DagsterInstance, keys: Iterable[str]) -> None:
        if instance.is_ephemeral:
            # An in-memory instance (tests, `dagster dev` without a home) cannot be opened again elsewhere.
            carry_partition_status(instance, LEADS_PARTITIONS, set(keys))
            return
        ref = instance.get_ref()
        with self._lock:
            self._pending.setdefault(serialize_value(ref), (ref, set()))[1].update(keys)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="carry-partition-status", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                name = next(iter(self._pending))
                ref, taken = self._pending.pop(name)
            try:
                with DagsterInstance.from_ref(ref) as instance:
                    carried = carry_partition_status(instance, LEADS_PARTITIONS, taken)
            except Exception:  # noqa: BLE001 - the UI rebuilds what is not carried; the thread must not die
                logger.warning("could not carry the partition status over to %d new lead(s)", len(taken), exc_info=True)
                carried = []
            if not carried:
                with self._lock:
                    if name in self._pending:
                        self._pending[name][1].update(taken)

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait until every key added so far is carried (tests)."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)


_carrier = _Carrier()


def carry_status_soon(instance: DagsterInstance, keys: Iterable[str]) -> None:
    """Carry the sources' partition status over to `keys`, just added, in the background."""
    _carrier.add(instance, keys)


def wait_for_carried_status(timeout_s: float = 30.0) -> None:
    _carrier.join(timeout_s)


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
