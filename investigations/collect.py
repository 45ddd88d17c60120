"""One collection: ask a source about a lead, store its records, and account for what happened.

This is the engine call behind every source asset. It is idempotent: collecting the same
(source, lead) again against the same answers stores the same file (see records.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NoReturn
from datetime import datetime

from investigations.adapters import ParseError, ParsedRecord, build_adapter
from investigations.fetcher import Fetcher, FetchFailed, FetchParked
from investigations.pacing import Circuits
from investigations.records import RecordStore
from investigations.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore, utcnow


@dataclass(frozen=True)
class CollectionResult:
    source: str
    lead_id: str
    outcome: str  # "ok" (records found) or "empty" (the source answered, with nothing in it)
    records: int
    expected_min_records: int
    path: str
    content_hash: str
    changed: bool
    requests: int
    sample_keys: list[str] = field(default_factory=list)


class CollectionFailed(Exception):
    """The collection gave up. It is in the dead letters; `retryable` says if a re-run may help."""

    def __init__(self, *, source: str, lead_id: str, reason_group: str, last_status: int | None,
                 attempts: int, last_error: str) -> None:
        super().__init__(f"{source}/{lead_id}: {reason_group} after {attempts} attempt(s): {last_error}")
        self.source = source
        self.lead_id = lead_id
        self.reason_group = reason_group
        self.last_status = last_status
        self.attempts = attempts
        self.last_error = last_error

    @property
    def retryable(self) -> bool:
        return self.reason_group not in ("permanent", "refused", "unknown_lead")


class CollectionParked(Exception):
    """The collection waits (circuit open, or the source kept throttling) and is back in the queue."""

    def __init__(self, *, source: str, lead_id: str, retry_in_s: float, reason: str) -> None:
        super().__init__(f"{source}/{lead_id}: parked for {retry_in_s:.0f} s: {reason}")
        self.source = source
        self.lead_id = lead_id
        self.retry_in_s = retry_in_s
        self.reason = reason


# Failures that say something about the source (its circuit), not about the lead.
SOURCE_FAILURES = frozenset({"transient", "throttled", "blocked"})


class Collector:
    """Runs collections with one fetcher; the caller owns (and closes) the fetcher and stores."""

    def __init__(
        self,
        *,
        catalog: SourceCatalog,
        store: StateStore,
        records: RecordStore,
        fetcher: Fetcher,
        circuits: Circuits | None = None,
        now: Callable[[], datetime] = utcnow,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.records = records
        self.fetcher = fetcher
        self.circuits = circuits
        self.now = now

    def collect(self, source: str, lead_id: str, *, run_id: str | None = None) -> CollectionResult:
        """Collect one (source, lead).

        Raises CollectionFailed after recording a dead letter, or CollectionParked after putting the
        collection back in the queue (circuit open, throttled too long).
        """
        spec = self.catalog.get(source)
        lead = self.store.get_lead(lead_id)
        if lead is None or not spec.accepts(lead.kind):
            why = "is not in the state store" if lead is None else f"is a {lead.kind} lead, which {source} does not take"
            self._fail(source, lead_id, run_id, reason_group="unknown_lead", last_status=None, attempts=0,
                       last_error=f"lead {lead_id} {why}")
        if self.circuits is not None:
            decision = self.circuits.allow(source, spec.circuit)
            if not decision.allowed:
                self._park(source, lead_id, retry_in_s=decision.retry_in_s, reason=decision.reason)
        adapter = build_adapter(spec)
        found: list[ParsedRecord] = []
        requests = 0
        for planned in adapter.requests_for(lead):
            try:
                response = self.fetcher.fetch(spec, planned, lead_id=lead_id, run_id=run_id)
            except FetchParked as parked:
                self._record_circuit(spec, success=False)
                self._park(source, lead_id, retry_in_s=parked.retry_in_s, reason=parked.reason)
            except FetchFailed as failed:
                self._fail(source, lead_id, run_id, reason_group=failed.reason_group,
                           last_status=failed.last_status, attempts=requests + failed.attempts,
                           last_error=failed.last_error)
            requests += response.attempts
            try:
                found.extend(adapter.parse(response.body, url=response.url))
            except ParseError as exc:
                self._fail(source, lead_id, run_id, reason_group="permanent", last_status=response.status,
                           attempts=requests, last_error=f"unparseable answer: {exc}")
        written = self.records.write(source, lead_id, found, fetched_at=self.now())
        outcome = "ok" if written.records else "empty"
        now = self.now()
        self.store.record_collection(source=source, lead_id=lead_id, outcome=outcome, records=written.records,
                                     content_hash=written.content_hash, path=str(written.path), run_id=run_id,
                                     now=now)
        self.store.finish_dispatched(source, lead_id, outcome=outcome, now=now)
        self._record_circuit(spec, success=True)
        return CollectionResult(
            source=source,
            lead_id=lead_id,
            outcome=outcome,
            records=written.records,
            expected_min_records=spec.expected_min_records,
            path=str(written.path),
            content_hash=written.content_hash,
            changed=written.changed,
            requests=requests,
            sample_keys=sorted(r.key for r in found)[:5],
        )

    def _record_circuit(self, spec: SourceSpec, *, success: bool) -> None:
        if self.circuits is not None:
            self.circuits.record(spec.name, spec.circuit, success=success)

    def _park(self, source: str, lead_id: str, *, retry_in_s: float, reason: str) -> NoReturn:
        now = self.now()
        until = now + timedelta(seconds=retry_in_s)
        if not self.store.park_dispatched(source, lead_id, until=until):
            # Launched outside the backlog (from the UI, say): queue it so the work is not lost.
            self.store.enqueue([(source, lead_id)], origin=f"parked:{now.isoformat()}", priority_class="recurring",
                               not_before=until, now=now)
        raise CollectionParked(source=source, lead_id=lead_id, retry_in_s=retry_in_s, reason=reason)

    def _fail(
        self,
        source: str,
        lead_id: str,
        run_id: str | None,
        *,
        reason_group: str,
        last_status: int | None,
        attempts: int,
        last_error: str,
    ) -> NoReturn:
        if reason_group in SOURCE_FAILURES:
            self._record_circuit(self.catalog.get(source), success=False)
        now = self.now()
        self.store.put_dead_letter(source=source, lead_id=lead_id, reason_group=reason_group,
                                   last_status=last_status, attempts=attempts, last_error=last_error, now=now)
        self.store.record_collection(source=source, lead_id=lead_id, outcome="failed", records=0,
                                     content_hash=None, path=None, run_id=run_id, now=now)
        self.store.finish_dispatched(source, lead_id, outcome="failed", now=now)
        raise CollectionFailed(source=source, lead_id=lead_id, reason_group=reason_group,
                               last_status=last_status, attempts=attempts, last_error=last_error)
