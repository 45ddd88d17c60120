"""One collection: ask a source about a lead, store its records, and account for what happened.

This is the engine call behind every source asset. It is idempotent: collecting the same
(source, lead) again against the same answers stores the same file (see records.py).

With an identity pool, a collection leases an identity for the source for as long as it runs and
gives it back in `finally`, whatever happens. No identity free now means the collection is parked
(back in the queue shortly, like an open circuit), not failed. An identity blocked mid-collection is
released and another leased, up to MAX_IDENTITIES_PER_COLLECTION, so one bad identity does not fail
the lead. Without a pool (no identities file) every request goes out as the one `direct` identity.

Every answer a collection uses is kept as evidence (a WARC capture, see evidence.py), and each
record stored points at the capture it was parsed from.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NoReturn

from investigations.adapters import ParsedRecord, ParseError, TtlCache, build_adapter
from investigations.events import RequestTally
from investigations.evidence import Capture, EvidenceStore
from investigations.fetcher import Fetcher, FetchFailed, FetchParked
from investigations.identities.sessions import IdentityBlocked, IdentitySession, Sessions
from investigations.pacing import Circuits, RateLanes
from investigations.records import RecordStore
from investigations.redaction import redact_url
from investigations.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore, utcnow

log = logging.getLogger(__name__)

# A collection whose identity gets blocked goes on with another, up to this many in all: one bad
# identity must not fail a lead, but a source that blocks every identity it sees is not worth more.
MAX_IDENTITIES_PER_COLLECTION = 3
# No identity can go to the source now (all resting, retired or lane-limited): back in the queue for
# this long. Short: a rest or a lane frees up within seconds to minutes.
NO_IDENTITY_RETRY_S = 15.0
# Every identity is leased by other collections of the source: a lease lasts one collection (about
# one identity-lane interval), so one is free again within a second or so. Wait this long at most,
# polling every LEASE_POLL_S (jittered), before parking: parking a lead only because a batch run has
# more threads than the pool has identities would send it back to the queue for nothing.
LEASE_WAIT_S = 30.0
LEASE_POLL_S = 0.1
# An adapter plans further requests from answers (a bootstrap file, the next record type); a
# source whose answers keep asking for more is broken, not busy.
MAX_REQUESTS_PER_COLLECTION = 20
# A lease outlives the longest a collection can spend on one request by this much (see lease_ttl_s).
LEASE_MARGIN_S = 60.0


def lease_ttl_s(spec: SourceSpec) -> float:
    """How long to lease an identity for one request of `spec` at most: every attempt timing out
    after the longest backoff, plus the time a throttled request may wait before it parks. The
    lease is extended by that much before each further request, and released as soon as it ends."""
    attempts_s = spec.retry.attempts * (spec.timeout_s + spec.retry.max_delay_s)
    worst_request_s = attempts_s + spec.throttle.park_after_s
    return worst_request_s + LEASE_MARGIN_S


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
    # What the lead id (a hash) stands for, for people looking for the lead by its value.
    lead_kind: str = ""
    lead_value: str = ""
    # The fields every record carried (with a value): what the schema-drift check compares.
    common_fields: list[str] = field(default_factory=list)


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
        if max_identities < 1:
            raise ValueError(f"max_identities ({max_identities}) must be >= 1")
        self.catalog = catalog
        self.store = store
        self.records = records
        self.fetcher = fetcher
        self.circuits = circuits
        self.now = now
        self.max_identities = max_identities
        self.no_identity_retry_s = no_identity_retry_s
        self.lease_wait_s = lease_wait_s
        self.clock = clock
        self.sleep = sleep
        self.cache = cache  # what adapters learn from bootstrap files (None: the process's own)
        # Captures live in the data dir beside the records (`<data dir>/records` and `/evidence`).
        self.evidence = evidence if evidence is not None else EvidenceStore(records.root.parent)
        self._lease_gates: dict[str, threading.Lock] = {}
        self._gates_lock = threading.Lock()

    def collect(self, source: str, lead_id: str, *, run_id: str | None = None,
                background: bool = False) -> CollectionResult:
        """Collect one (source, lead); `background` work (a recurring crawl, a backfill) leaves the
        rate lanes' later slots to fresh leads (see Fetcher.fetch).

        Raises CollectionFailed after recording a dead letter, or CollectionParked after putting the
        collection back in the queue (circuit open, throttled too long, no identity free).
        """
        spec = self.catalog.get(source)
        # Before anything of the lead is touched: a run that dies from here on blames this lead.
        self.store.mark_started(source, lead_id)
        lead = self.store.get_lead(lead_id)
        if lead is None or not spec.accepts(lead.kind):
            why = "is not in the state store" if lead is None else f"is a {lead.kind} lead, which {source} does not take"
            self._fail(source, lead_id, run_id, reason_group="unknown_lead", last_status=None, attempts=0,
                       last_error=f"lead {lead_id} {why}")
        if self.circuits is not None:
            decision = self.circuits.allow(source, spec.circuit)
            if not decision.allowed:
                self._park(source, lead_id, retry_in_s=decision.retry_in_s, reason=decision.reason)
        adapter = build_adapter(spec, cache=self.cache)
        found: list[ParsedRecord] = []
        captures: list[Capture] = []  # captures[i]: the answer found[i] was parsed from
        evidence = self.evidence.open(source, lead_id, now=self.now)
        requests = 0
        tally = RequestTally()
        identities = _Identities(self.fetcher.sessions, self.fetcher.lanes, spec, holder=run_id or f"collect-{uuid.uuid4().hex}")
        try:
            if not self._lease_first(identities, source):
                busy = identities.others_leasing()
                self._park(source, lead_id, retry_in_s=self.no_identity_retry_s,
                           reason=f"all identities for {source} leased by other collections for "
                                  f"{self.lease_wait_s:.0f} s" if busy else
                           f"no identity available for {source} (all resting, retired or rate-limited)")
            try:
                pending = adapter.requests_for(lead)
            except ParseError as exc:  # the source cannot be asked about this lead (no RDAP server for its TLD)
                self._fail(source, lead_id, run_id, reason_group="permanent", last_status=None, attempts=0,
                           last_error=str(exc))
            planned_count = len(pending)
            while pending:
                planned = pending.pop(0)
                while True:
                    try:
                        response = self.fetcher.fetch(spec, planned, lead_id=lead_id, run_id=run_id,
                                                      session=identities.current(), background=background,
                                                      judge=adapter, tally=tally)
                        break
                    except IdentityBlocked as blocked:
                        requests += blocked.requests
                        identities.drop()
                        log.warning("identity switched mid-collection: source=%s lead_id=%s identity_id=%s "
                                    "requests=%d reason=%s", source, lead_id, blocked.identity_id,
                                    blocked.requests, blocked.reason)
                        if identities.used >= self.max_identities:
                            self._fail(source, lead_id, run_id, reason_group="blocked",
                                       last_status=blocked.last_status, attempts=requests,
                                       last_error=f"{identities.used} identities blocked in turn; "
                                                  f"last: {blocked}")
                        if not identities.lease_next():
                            self._park(source, lead_id, retry_in_s=self.no_identity_retry_s,
                                       reason=f"identity {blocked.identity_id} blocked, no other available")
                    except FetchParked as parked:
                        self._record_circuit(spec, success=False)
                        self._park(source, lead_id, retry_in_s=parked.retry_in_s, reason=parked.reason)
                    except FetchFailed as failed:
                        self._fail(source, lead_id, run_id, reason_group=failed.reason_group,
                                   last_status=failed.last_status, attempts=requests + failed.attempts,
                                   last_error=failed.last_error)
                requests += response.attempts
                capture = evidence.capture(response)
                try:
                    if response.empty and not planned.collects:
                        raise ParseError(f"HTTP {response.status} from {redact_url(response.url)}, which should "
                                         "name what to ask next")
                    if planned.collects and not response.empty:
                        parsed = adapter.parse(response.body, url=response.url)
                        found.extend(parsed)
                        captures.extend([capture] * len(parsed))
                    more = [] if response.empty else adapter.follow(lead, planned, response.body)
                    planned_count += len(more)
                    if planned_count > MAX_REQUESTS_PER_COLLECTION:
                        raise ParseError(f"answers asked for more than {MAX_REQUESTS_PER_COLLECTION} requests")
                    pending.extend(more)
                except ParseError as exc:
                    self._fail(source, lead_id, run_id, reason_group="permanent", last_status=response.status,
                               attempts=requests, last_error=f"unparseable answer: {exc}")
        finally:
            try:
                identities.close()
            finally:
                evidence.close()
        written = self.records.write(source, lead_id, found, fetched_at=self.now(), captures=captures,
                                     parser_version=adapter.parser_version)
        outcome = "ok" if written.records else "empty"
        now = self.now()
        # The file first, then its bookkeeping in one transaction: a crash between the two leaves the
        # lead owed, and collecting it again stores the same records once (pointing at its capture).
        fields_in_all = common_fields(found)
        self.store.complete_collection(source=source, lead_id=lead_id, outcome=outcome, records=written.records,
                                       content_hash=written.content_hash, path=str(written.path), run_id=run_id,
                                       now=now, common_fields=fields_in_all)
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
            identity_ids=identities.identity_ids,
            lease_ids=identities.lease_ids,
            sent=tally.per_identity(),
            lead_kind=lead.kind,
            lead_value=lead.value,
            common_fields=fields_in_all,
        )

    def _lease_first(self, identities: _Identities, source: str) -> bool:
        """Lease an identity, waiting up to `lease_wait_s` while every one is leased by other
        collections (they free up within about a lane interval); not while none is usable at all.

        Of a process's collections waiting for an identity of one source, one asks the pool at a
        time (the source's lease gate); the others wait their turn without asking. A batch run has
        more threads than the pool has identities, and every thread asking every poll interval cost
        more CPU than the collections themselves (two batch runs of 8 threads on 3 identities:
        about a quarter of their workers' CPU went into asking).
        """
        deadline = self.clock() + self.lease_wait_s
        gate = self._lease_gate(source)
        if not gate.locked() and identities.lease_next():
            return True  # one was free and nobody was waiting for it before us
        real_time = self.sleep is time.sleep
        # Behind the gate until our turn or the deadline (an injected clock cannot time a real lock).
        if not (gate.acquire(timeout=max(0.0, deadline - self.clock())) if real_time else gate.acquire()):
            return False  # waited the whole time behind collections that waited longer
        try:
            while not identities.lease_next():
                if self.clock() >= deadline:
                    return False
                if not identities.others_leasing():
                    # A lease may have come back between the two questions: ask once more before
                    # taking the pool as spent.
                    if identities.lease_next():
                        return True
                    if not identities.others_leasing():
                        return False
                poll_s = LEASE_POLL_S * random.uniform(0.5, 1.5)
                if real_time and self.fetcher.pool is not None:
                    self.fetcher.pool.wait_for_release(poll_s)  # woken early by a lease given back here
                else:
                    self.sleep(poll_s)  # an injected sleep (tests) keeps its own time
            return True
        finally:
            gate.release()

    def _lease_gate(self, source: str) -> threading.Lock:
        with self._gates_lock:
            return self._lease_gates.setdefault(source, threading.Lock())

    def _record_circuit(self, spec: SourceSpec, *, success: bool) -> None:
        if self.circuits is not None:
            self.circuits.record(spec.name, spec.circuit, success=success)

    def _park(self, source: str, lead_id: str, *, retry_in_s: float, reason: str) -> NoReturn:
        now = self.now()
        until = now + timedelta(seconds=retry_in_s)
        if not self.store.park_dispatched(source, lead_id, until=until, reason=reason):
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
        self.store.complete_collection(source=source, lead_id=lead_id, outcome="failed", records=0,
                                       content_hash=None, path=None, run_id=run_id, now=now)
        raise CollectionFailed(source=source, lead_id=lead_id, reason_group=reason_group,
                               last_status=last_status, attempts=attempts, last_error=last_error)


class _Identities:
    """The identities one collection sends as: at most one session at a time, each closed (its
    cookies saved, its lease released) when dropped or when the collection ends. Without a pool:
    the direct identity's session."""

    def __init__(self, sessions: Sessions, lanes: RateLanes | None, spec: SourceSpec, *, holder: str) -> None:
        self._sessions = sessions
        self._pool = sessions.pool
        self._lanes = lanes
        self._spec = spec
        self._holder = holder
        self._ttl_s = lease_ttl_s(spec)
        self._session: IdentitySession | None = None
        self._fresh = False  # the lease was just taken: no heartbeat before its first request
        self.used = 0
        self.identity_ids: list[str] = [] if self._pool is not None else [sessions.direct().identity_id]
        self.lease_ids: list[str] = []

    def lease_next(self) -> bool:
        """Lease an identity for the source: one whose lane can send now if any, else any free one
        (it then waits for its lane in the fetcher). False when none can be leased."""
        if self._pool is None:
            return True
        lease = None
        if self._lanes is not None:
            lease = self._pool.acquire(self._spec.name, holder=self._holder, ttl_s=self._ttl_s, lanes=self._lanes,
                                       min_tier=self._min_tier())
        if lease is None:
            lease = self._pool.acquire(self._spec.name, holder=self._holder, ttl_s=self._ttl_s,
                                       min_tier=self._min_tier())
        if lease is None:
            return False
        self._session, self._fresh = self._sessions.open(lease), True
        self.used += 1
        if lease.identity_id not in self.identity_ids:
            self.identity_ids.append(lease.identity_id)
        self.lease_ids.append(lease.lease_id)
        return True

    def others_leasing(self) -> bool:
        """Whether other collections hold leases for the source now (so one may free up soon)."""
        return self._pool is not None and bool(self._pool.active_leases(self._spec.name))

    def current(self) -> IdentitySession:
        """The session to send the next request in, its lease extended first unless just taken. A
        lease lost meanwhile (expired and taken over) raises IdentityBlocked, as a blocked identity would."""
        if self._session is None:
            return self._sessions.direct()
        if self._fresh:
            self._fresh = False
        else:
            self._session.heartbeat(ttl_s=self._ttl_s)
        return self._session

    def drop(self) -> None:
        """Give the current identity back: its cookies saved, its lease released."""
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def close(self) -> None:
        self.drop()

    def _min_tier(self) -> str | None:
        """The source's own minimum tier, when the identities file has it (the cheapest otherwise)."""
        assert self._pool is not None
        tier = self._spec.identity_tier
        if tier in self._pool.catalog.tiers:
            return tier
        if (self._spec.name, tier) not in _UNKNOWN_TIERS_WARNED:
            _UNKNOWN_TIERS_WARNED.add((self._spec.name, tier))
            log.warning("identity_tier is not a tier of the identities file, leasing from the cheapest: "
                        "source=%s identity_tier=%s tiers=%s", self._spec.name, tier,
                        ",".join(self._pool.catalog.tiers))
        return None


_UNKNOWN_TIERS_WARNED: set[tuple[str, str]] = set()
