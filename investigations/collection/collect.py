"""One collection: ask a source about a lead, store its records, and account for what happened.

`Collector.collect` reads as its steps: plan the requests for the lead (its adapter), fetch each as
an identity leased for the collection (the fetcher, `identities.leasing`), parse what each answer
holds and asks for next, and store the records with their bookkeeping. A step that cannot go on says
so as a `_Wait` (the collection is parked: back in the queue shortly) or a `_GiveUp` (a dead
letter); `collect` records which, in one place.

It is idempotent: collecting the same (source, lead) again against the same answers stores the same
file (see evidence/records.py). Every answer a collection uses is kept as evidence (a WARC capture, see
evidence/captures.py), and each record stored points at the capture it was parsed from.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NoReturn

from investigations.adapters import Adapter, ParsedRecord, ParseError, PlannedRequest, TtlCache, build_adapter
from investigations.collection.events import RequestTally
from investigations.collection.fetcher import Fetcher, FetchFailed, FetchParked, FetchResult
from investigations.evidence.captures import Capture, EvidenceStore
from investigations.evidence.records import RecordChanges, RecordStore
from investigations.identities.leasing import (
    LEASE_WAIT_S,
    MAX_IDENTITIES_PER_COLLECTION,
    NO_IDENTITY_RETRY_S,
    CollectionIdentities,
    IdentitiesSpent,
    Leasing,
    NoIdentity,
)
from investigations.identities.sessions import IdentityBlocked
from investigations.intake.leads import Lead
from investigations.net.redaction import redact_url
from investigations.pacing import Circuits
from investigations.sources.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore, utcnow

# An adapter plans further requests from answers (a bootstrap file, the next record type); a
# source whose answers keep asking for more is broken, not busy.
MAX_REQUESTS_PER_COLLECTION = 20


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
    # Who the requests went out as: identity ids (never proxy URLs or credentials), in order of use,
    # and the leases they were sent under (none for the direct identity, which is not leased).
    identity_ids: list[str] = field(default_factory=list)
    lease_ids: list[str] = field(default_factory=list)
    # What the collection sent, per identity id: (requests, bytes of answer), every attempt counted
    # as the fetch log records it. Its cost is priced from this (`cost.collection_cost_usd`).
    sent: dict[str, tuple[int, int]] = field(default_factory=dict)
    # What the lead id (a hash) stands for, for people looking for the lead by its value, and the
    # Dagster partition the collection is reported on (`kind:value`, or the id of an older lead).
    lead_kind: str = ""
    lead_value: str = ""
    partition_key: str = ""
    # The fields every record carried (with a value): what the schema-drift check compares.
    common_fields: list[str] = field(default_factory=list)
    # What this collection changed in the lead's stored records, by record key (evidence/records.py).
    changes: RecordChanges = RecordChanges()


def common_fields(records: Sequence[ParsedRecord]) -> list[str]:
    """The fields every record carries with a value (sorted); none when there are no records."""
    if not records:
        return []
    shared = set.intersection(*({k for k, v in r.fields.items() if v not in (None, "")} for r in records))
    return sorted(shared)


# Why a collection gave up, as its dead letter says: what the fetcher gave up on (throttled,
# transient, blocked, permanent, refused), a lead the source cannot take, and a run that died
# MAX_RUN_DEATHS times (crashed).
DEAD_LETTER_REASONS = ("throttled", "transient", "blocked", "permanent", "refused", "unknown_lead", "crashed")


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


@dataclass
class _Collection:
    """One collection under way: what it is for, and what it has found and sent so far."""

    spec: SourceSpec
    lead_id: str
    run_id: str | None
    background: bool
    found: list[ParsedRecord] = field(default_factory=list)
    captures: list[Capture] = field(default_factory=list)  # captures[i]: the answer found[i] was parsed from
    requests: int = 0
    planned: int = 0
    tally: RequestTally = field(default_factory=RequestTally)
    partition_key: str = ""  # the lead's Dagster partition key, read with the lead


class _Wait(Exception):
    """A step cannot go on now: the collection goes back to the queue for `retry_in_s`."""

    def __init__(self, retry_in_s: float, reason: str) -> None:
        super().__init__(reason)
        self.retry_in_s = retry_in_s
        self.reason = reason


class _GiveUp(Exception):
    """A step gave up: the collection becomes a dead letter (`reason_group`, see DEAD_LETTER_REASONS)."""

    def __init__(self, reason_group: str, last_status: int | None, attempts: int, last_error: str) -> None:
        super().__init__(last_error)
        self.reason_group = reason_group
        self.last_status = last_status
        self.attempts = attempts
        self.last_error = last_error


class Collector:
    """Runs collections with one fetcher; the caller owns (and closes) the fetcher and stores.

    Identities are leased from the fetcher's pool (`fetcher.pool`), so the pool that hands out a
    lease is always the one the fetcher reports health to.
    """

    def __init__(
        self,
        *,
        catalog: SourceCatalog,
        store: StateStore,
        records: RecordStore,
        fetcher: Fetcher,
        circuits: Circuits | None = None,
        now: Callable[[], datetime] = utcnow,
        max_identities: int = MAX_IDENTITIES_PER_COLLECTION,
        no_identity_retry_s: float = NO_IDENTITY_RETRY_S,
        lease_wait_s: float = LEASE_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        cache: TtlCache | None = None,
        evidence: EvidenceStore | None = None,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.records = records
        self.fetcher = fetcher
        self.circuits = circuits
        self.now = now
        self.leasing = Leasing(fetcher.sessions, fetcher.lanes, max_identities=max_identities,
                               no_identity_retry_s=no_identity_retry_s, lease_wait_s=lease_wait_s, clock=clock,
                               sleep=sleep)
        self.cache = cache  # what adapters learn from bootstrap files (None: the process's own)
        # Captures live in the data dir beside the records (`<data dir>/records` and `/evidence`).
        self.evidence = evidence if evidence is not None else EvidenceStore(records.root.parent)

    def collect(self, source: str, lead_id: str, *, run_id: str | None = None,
                background: bool = False) -> CollectionResult:
        """Collect one (source, lead): plan, fetch, parse, store. `background` work (a recurring
        crawl, a backfill) leaves the rate lanes' later slots to fresh leads (see pacing.waiting).

        Raises CollectionFailed after recording a dead letter, or CollectionParked after putting the
        collection back in the queue (circuit open, throttled too long, no identity free).
        """
        work = _Collection(self.catalog.get(source), lead_id, run_id, background)
        # Before anything of the lead is touched: a run that dies from here on blames this lead.
        self.store.mark_started(source, lead_id)
        try:
            lead = self._admit(work)
            adapter = build_adapter(work.spec, cache=self.cache)
            with self.evidence.open(source, lead_id, now=self.now) as evidence, self._identities(work) as identities:
                pending = self._plan(work, adapter, lead)
                while pending:
                    planned = pending.pop(0)
                    answer = self._fetch(work, adapter, planned, identities)
                    pending += self._parse(work, adapter, lead, planned, answer, evidence.capture(answer))
        except _Wait as wait:
            self._park(work, wait)
        except _GiveUp as gave_up:
            self._fail(work, gave_up)
        return self._store(work, adapter, lead, identities)

    def _admit(self, work: _Collection) -> Lead:
        """The lead, when the source takes it and its circuit lets a collection through."""
        spec, keyed = work.spec, self.store.get_lead_keyed(work.lead_id)
        lead = keyed[0] if keyed else None
        if keyed is not None:
            work.partition_key = keyed[1]
        if lead is None or not spec.accepts(lead.kind):
            why = "is not in the state store" if lead is None else \
                f"is a {lead.kind} lead, which {spec.name} does not take"
            raise _GiveUp("unknown_lead", None, 0, f"lead {work.lead_id} {why}")
        if self.circuits is not None:
            decision = self.circuits.allow(spec.name, spec.circuit)
            if not decision.allowed:
                raise _Wait(decision.retry_in_s, decision.reason)
        return lead

    def _plan(self, work: _Collection, adapter: Adapter, lead: Lead) -> list[PlannedRequest]:
        """The requests the adapter plans for the lead (an answer may add more, see `_parse`)."""
        try:
            planned = adapter.requests_for(lead)
        except ParseError as exc:  # the source cannot be asked about this lead (no RDAP server for its TLD)
            raise _GiveUp("permanent", None, 0, str(exc)) from None
        work.planned = len(planned)
        return planned

    def _fetch(self, work: _Collection, adapter: Adapter, planned: PlannedRequest,
               identities: CollectionIdentities) -> FetchResult:
        """One planned request's answer, sent as the collection's identity: another identity when one
        is blocked (up to the leasing's limit)."""
        while True:
            try:
                answer = self.fetcher.fetch(work.spec, planned, lead_id=work.lead_id, run_id=work.run_id,
                                            session=identities.current(), background=work.background,
                                            judge=adapter, tally=work.tally)
            except IdentityBlocked as blocked:
                work.requests += blocked.requests
                try:
                    identities.switch(blocked)
                except IdentitiesSpent as spent:
                    raise _GiveUp("blocked", spent.last_status, work.requests, str(spent)) from None
                except NoIdentity as none:
                    raise _Wait(none.retry_in_s, none.reason) from None
                continue
            except FetchParked as parked:
                self._record_circuit(work.spec, success=False)
                raise _Wait(parked.retry_in_s, parked.reason) from None
            except FetchFailed as failed:
                raise _GiveUp(failed.reason_group, failed.last_status, work.requests + failed.attempts,
                              failed.last_error) from None
            work.requests += answer.attempts
            return answer

    @contextmanager
    def _identities(self, work: _Collection) -> Iterator[CollectionIdentities]:
        """The identities the collection sends as, leased for as long as it runs (identities.leasing)."""
        try:
            with self.leasing.held(work.spec, work.lead_id,
                                   holder=work.run_id or f"collect-{uuid.uuid4().hex}") as identities:
                yield identities
        except NoIdentity as none:
            raise _Wait(none.retry_in_s, none.reason) from None

    def _parse(self, work: _Collection, adapter: Adapter, lead: Lead, planned: PlannedRequest, answer: FetchResult,
               capture: Capture) -> list[PlannedRequest]:
        """What one answer holds (its records, when the request collects) and asks for next."""
        try:
            if answer.empty and not planned.collects:
                raise ParseError(f"HTTP {answer.status} from {redact_url(answer.url)}, which should name what to ask "
                                 "next")
            if planned.collects and not answer.empty:
                parsed = adapter.parse(answer.body, url=answer.url)
                work.found.extend(parsed)
                work.captures.extend([capture] * len(parsed))
            more = [] if answer.empty else adapter.follow(lead, planned, answer.body)
            work.planned += len(more)
            if work.planned > MAX_REQUESTS_PER_COLLECTION:
                raise ParseError(f"answers asked for more than {MAX_REQUESTS_PER_COLLECTION} requests")
            return more
        except ParseError as exc:
            raise _GiveUp("permanent", answer.status, work.requests, f"unparseable answer: {exc}") from None

    def _store(self, work: _Collection, adapter: Adapter, lead: Lead,
               identities: CollectionIdentities) -> CollectionResult:
        """Store the records, then their bookkeeping; what the collection did."""
        spec, found = work.spec, work.found
        written = self.records.write(spec.name, work.lead_id, found, fetched_at=self.now(), captures=work.captures,
                                     parser_version=adapter.parser_version)
        outcome = "ok" if written.records else "empty"
        # The file first, then its bookkeeping in one transaction: a crash between the two leaves the
        # lead owed, and collecting it again stores the same records once (pointing at its capture).
        fields_in_all = common_fields(found)
        self.store.complete_collection(source=spec.name, lead_id=work.lead_id, outcome=outcome,
                                       records=written.records, content_hash=written.content_hash,
                                       path=str(written.path), run_id=work.run_id, now=self.now(),
                                       common_fields=fields_in_all, change_prior_s=spec.recrawl.prior_s)
        self._record_circuit(spec, success=True)
        return CollectionResult(
            source=spec.name,
            lead_id=work.lead_id,
            outcome=outcome,
            records=written.records,
            expected_min_records=spec.expected_min_records,
            path=str(written.path),
            content_hash=written.content_hash,
            changed=written.changed,
            requests=work.requests,
            sample_keys=sorted(r.key for r in found)[:5],
            identity_ids=identities.identity_ids,
            lease_ids=identities.lease_ids,
            sent=work.tally.per_identity(),
            lead_kind=lead.kind,
            lead_value=lead.value,
            partition_key=work.partition_key or work.lead_id,
            common_fields=fields_in_all,
            changes=written.changes,
        )

    def _record_circuit(self, spec: SourceSpec, *, success: bool) -> None:
        if self.circuits is not None:
            self.circuits.record(spec.name, spec.circuit, success=success)

    def _park(self, work: _Collection, wait: _Wait) -> NoReturn:
        now = self.now()
        until = now + timedelta(seconds=wait.retry_in_s)
        source, lead_id = work.spec.name, work.lead_id
        if not self.store.park_dispatched(source, lead_id, until=until, reason=wait.reason):
            # Launched outside the backlog (from the UI, say): queue it so the work is not lost.
            self.store.enqueue([(source, lead_id)], origin=f"parked:{now.isoformat()}", priority_class="recurring",
                               not_before=until, now=now)
        raise CollectionParked(source=source, lead_id=lead_id, retry_in_s=wait.retry_in_s, reason=wait.reason)

    def _fail(self, work: _Collection, gave_up: _GiveUp) -> NoReturn:
        if gave_up.reason_group in SOURCE_FAILURES:
            self._record_circuit(work.spec, success=False)
        now = self.now()
        source, lead_id = work.spec.name, work.lead_id
        self.store.put_dead_letter(source=source, lead_id=lead_id, reason_group=gave_up.reason_group,
                                   last_status=gave_up.last_status, attempts=gave_up.attempts,
                                   last_error=gave_up.last_error, now=now)
        self.store.complete_collection(source=source, lead_id=lead_id, outcome="failed", records=0,
                                       content_hash=None, path=None, run_id=work.run_id, now=now)
        raise CollectionFailed(source=source, lead_id=lead_id, reason_group=gave_up.reason_group,
                               last_status=gave_up.last_status, attempts=gave_up.attempts,
                               last_error=gave_up.last_error)
