"""Collector: one (source, lead) collected over real loopback HTTP from the sandbox web, end to end."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from investigations.collection.collect import CollectionFailed, CollectionParked, Collector
from investigations.collection.fetcher import Fetcher
from investigations.evidence.records import RecordStore
from investigations.intake.leads import Lead, normalize_lead
from investigations.pacing import Circuits
from investigations.sources.specs import SourceCatalog, load_sources, parse_sources
from investigations.store import StateStore

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SECRET = "s3cr3t-token-value"
EXAMPLE = normalize_lead("domain", "example.com")

# The same source name twice: once at a port nobody listens on, once at the sandbox's robust API,
# so a later good collection can follow a failed one for the same (source, lead).
LOOKUP = """\
sources:
  - name: lookup
    adapter: json_api
    lead_kinds: [domain]
    request:
      url: "{base}?kind={{kind}}&q={{value}}&api_key=${{LOOKUP_KEY}}"
      headers: {{Authorization: "Bearer ${{LOOKUP_KEY}}", X-Client: "tenant-${{LOOKUP_KEY}}"}}
    parse: {{records_path: results, record_key: id}}
    retry: {{attempts: 2, base_delay_s: 0.01, max_delay_s: 0.02}}
    timeout_s: 2
"""


class Clock:
    """The collector's wall clock, moved by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@dataclass
class World:
    store: StateStore
    records: RecordStore
    fetcher: Fetcher
    clock: Clock

    def collector(self, catalog: SourceCatalog) -> Collector:
        return Collector(catalog=catalog, store=self.store, records=self.records, fetcher=self.fetcher, now=self.clock)

    def lead(self, lead: Lead = EXAMPLE) -> str:
        self.store.add_lead(lead, case_id="case-1", now=T0)
        return lead.id


@pytest.fixture
def world(sqlite_store: StateStore, tmp_path: Path) -> Iterator[World]:
    fetcher = Fetcher(sink=sqlite_store, sleep=lambda s: None)
    try:
        yield World(sqlite_store, RecordStore(tmp_path / "records"), fetcher, Clock())
    finally:
        fetcher.close()


@pytest.fixture
def fleet(sandbox) -> SourceCatalog:
    """The repo's own sources.yaml, pointed at the test sandbox."""
    return load_sources(ROOT / "sources.yaml", env={"INVESTIGATIONS_SANDBOX_URL": sandbox.url})


def lookup_catalog(base: str) -> SourceCatalog:
    return parse_sources(LOOKUP.format(base=base), env={"LOOKUP_KEY": SECRET})


CLOSED_PORT = "http://127.0.0.1:9/x"


# -- a working source -------------------------------------------------------------------------------


def test_robust_source_collects_records_into_a_file(world: World, fleet: SourceCatalog) -> None:
    result = world.collector(fleet).collect("robust", world.lead(), run_id="run-1")
    table = world.records.read("robust", EXAMPLE.id)
    assert result.outcome == "ok" and result.records >= 1 and result.changed is True
    assert Path(result.path).exists()
    assert table.num_rows == result.records
    assert result.sample_keys == sorted(table.column("record_key").to_pylist())[:5]
    assert (result.requests, result.expected_min_records) == (1, 1)


def test_robust_collection_is_recorded_as_ok(world: World, fleet: SourceCatalog) -> None:
    result = world.collector(fleet).collect("robust", world.lead(), run_id="run-1")
    row = world.store.collection("robust", EXAMPLE.id)
    assert (row.outcome, row.records, row.content_hash, row.path, row.run_id) == (
        "ok", result.records, result.content_hash, result.path, "run-1")
    assert row.last_success_at == T0


def test_collecting_the_same_answer_again_is_unchanged(world: World, fleet: SourceCatalog) -> None:
    collector = world.collector(fleet)
    first = collector.collect("robust", world.lead())
    world.clock.advance(hours=6)
    again = collector.collect("robust", EXAMPLE.id)
    assert again.changed is False
    assert again.content_hash == first.content_hash
    # The records are the same; they now point at the re-run's capture (see test_evidence.py).
    assert set(world.records.read("robust", EXAMPLE.id).column("fetched_at").to_pylist()) == {T0 + timedelta(hours=6)}


def test_the_fetch_log_has_one_row_per_request_with_status_and_latency(world: World, fleet: SourceCatalog) -> None:
    world.collector(fleet).collect("robust", world.lead(), run_id="run-1")
    [row] = world.store.fetch_log(source="robust", lead_id=EXAMPLE.id)
    assert (row["status"], row["outcome"], row["attempt"], row["run_id"]) == (200, "ok", 1, "run-1")
    assert row["latency_ms"] > 0 and row["bytes"] > 0
    assert "/robust/api/lookup?kind=domain&q=example.com" in row["url"]


def test_a_collection_reports_what_it_sent_per_identity_as_the_fetch_log_has_it(world: World,
                                                                               fleet: SourceCatalog) -> None:
    result = world.collector(fleet).collect("robust", world.lead(), run_id="run-1")
    rows = world.store.fetch_log(source="robust", lead_id=EXAMPLE.id)
    assert result.sent == {"direct": (len(rows), sum(row["bytes"] for row in rows))}
    assert result.sent["direct"][1] > 0


# -- a quiet source ---------------------------------------------------------------------------------


def test_quiet_source_answering_nothing_is_an_empty_collection(world: World, fleet: SourceCatalog) -> None:
    result = world.collector(fleet).collect("quiet", world.lead())
    assert (result.outcome, result.records) == ("empty", 0)
    assert world.records.read("quiet", EXAMPLE.id).num_rows == 0
    assert world.store.collection("quiet", EXAMPLE.id).outcome == "empty"
    assert world.store.dead_letters() == []


def test_quiet_source_switched_on_collects_records(world: World, fleet: SourceCatalog, sandbox) -> None:
    sandbox.app_state.configure("quiet", {"empty": False})
    try:
        result = world.collector(fleet).collect("quiet", world.lead())
    finally:
        sandbox.app_state.configure("quiet", {"empty": True})
    assert result.outcome == "ok" and result.records >= 1


# -- failures ---------------------------------------------------------------------------------------


def test_a_closed_port_fails_as_transient_after_every_attempt(world: World) -> None:
    with pytest.raises(CollectionFailed) as raised:
        world.collector(lookup_catalog(CLOSED_PORT)).collect("lookup", world.lead())
    failed = raised.value
    assert (failed.reason_group, failed.attempts, failed.last_status) == ("transient", 2, None)
    assert failed.retryable is True


def test_a_failed_collection_leaves_a_dead_letter_without_secrets(world: World) -> None:
    with pytest.raises(CollectionFailed):
        world.collector(lookup_catalog(CLOSED_PORT)).collect("lookup", world.lead())
    [letter] = world.store.dead_letters()
    assert (letter.source, letter.lead_id, letter.reason_group, letter.attempts) == (
        "lookup", EXAMPLE.id, "transient", 2)
    assert letter.last_error and SECRET not in letter.last_error


def test_a_failed_collection_is_recorded_as_failed(world: World) -> None:
    with pytest.raises(CollectionFailed):
        world.collector(lookup_catalog(CLOSED_PORT)).collect("lookup", world.lead(), run_id="run-1")
    row = world.store.collection("lookup", EXAMPLE.id)
    assert (row.outcome, row.records, row.path, row.last_success_at) == ("failed", 0, None, None)
    assert world.records.read("lookup", EXAMPLE.id) is None


def test_every_failed_attempt_is_logged_redacted(world: World) -> None:
    with pytest.raises(CollectionFailed):
        world.collector(lookup_catalog(CLOSED_PORT)).collect("lookup", world.lead())
    rows = world.store.fetch_log(source="lookup")
    assert [(r["attempt"], r["status"], r["outcome"]) for r in rows] == [(1, None, "transient"), (2, None, "transient")]
    assert all("api_key=***" in r["url"] for r in rows)
    assert not any(SECRET in f"{r['url']} {r['error']}" for r in rows)


def test_a_later_success_clears_the_dead_letter(world: World, sandbox) -> None:
    lead_id = world.lead()
    with pytest.raises(CollectionFailed):
        world.collector(lookup_catalog(CLOSED_PORT)).collect("lookup", lead_id)
    world.clock.advance(hours=1)
    result = world.collector(lookup_catalog(f"{sandbox.url}/robust/api/lookup")).collect("lookup", lead_id)
    assert result.outcome == "ok"
    assert world.store.dead_letters() == []
    assert world.store.collection("lookup", lead_id).last_success_at == T0 + timedelta(hours=1)


def test_an_unknown_lead_fails_without_a_request_and_is_not_retryable(world: World, fleet: SourceCatalog) -> None:
    with pytest.raises(CollectionFailed) as raised:
        world.collector(fleet).collect("robust", "domain-0000000000000000")
    assert (raised.value.reason_group, raised.value.attempts, raised.value.retryable) == ("unknown_lead", 0, False)
    assert world.store.fetch_log() == []
    assert [d.reason_group for d in world.store.dead_letters()] == ["unknown_lead"]


def test_a_lead_of_a_kind_the_source_does_not_take_is_an_unknown_lead(world: World, fleet: SourceCatalog) -> None:
    lead_id = world.lead(normalize_lead("ip", "8.8.8.8"))
    with pytest.raises(CollectionFailed) as raised:
        world.collector(fleet).collect("robust", lead_id)
    assert raised.value.reason_group == "unknown_lead"
    assert "does not take" in raised.value.last_error


def test_a_parked_collection_launched_outside_the_backlog_is_queued_not_lost(sandbox, tmp_path) -> None:
    catalog = load_sources(Path(__file__).resolve().parents[3] / "sources.yaml",
                           env={"INVESTIGATIONS_SANDBOX_URL": sandbox.url})
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    lead = normalize_lead("domain", "example.com")
    store.add_lead(lead, case_id="c")
    spec = catalog.get("robust")
    circuits = Circuits(store)
    for _ in range(spec.circuit.failure_threshold):
        circuits.record("robust", spec.circuit, success=False)
    with Fetcher(sink=store) as fetcher:
        collector = Collector(catalog=catalog, store=store, records=RecordStore(tmp_path / "records"),
                              fetcher=fetcher, circuits=circuits)
        with pytest.raises(CollectionParked):
            collector.collect("robust", lead.id)
    assert store.queue_depths()["robust"]["waiting"] == 1
    assert store.dead_letters() == []


# -- a crash between the Parquet write and the queue's bookkeeping ---------------------------------


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it in the process runs (not even `except Exception`)."""


def _dispatched(world: World, lead_id: str) -> None:
    world.store.enqueue([("robust", lead_id)], origin="inbox:1", priority_class="interactive", now=T0)
    (row,) = world.store.dispatch("robust", limit=1, now=T0)
    world.store.assign_handover([row.id], handover_key="robust:handover-1")


def test_a_crash_after_the_write_neither_loses_the_lead_nor_writes_it_twice(
    world: World, fleet: SourceCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    lead_id = world.lead()
    _dispatched(world, lead_id)
    real = world.store.complete_collection

    def crash(**kwargs):
        raise Killed

    monkeypatch.setattr(world.store, "complete_collection", crash)
    with pytest.raises(Killed):
        world.collector(fleet).collect("robust", lead_id, run_id="run-killed")
    path = world.records.path_for("robust", lead_id)
    written = world.records.stored_hash(path)
    # The file is there, the bookkeeping is not: the lead is still owed to its handover.
    assert world.store.collection("robust", lead_id) is None
    assert world.store.handover_leads("robust:handover-1") == [lead_id]

    monkeypatch.setattr(world.store, "complete_collection", real)
    world.clock.advance(seconds=5)
    again = world.collector(fleet).collect("robust", lead_id, run_id="run-retry")
    # The same records once, pointing at the retry's capture (each collection keeps its own evidence).
    assert again.changed is False and again.content_hash == written
    keys = world.records.read("robust", lead_id).column("record_key").to_pylist()
    assert len(keys) == len(set(keys)) == again.records
    row = world.store.collection("robust", lead_id)
    assert (row.outcome, row.run_id, row.content_hash) == ("ok", "run-retry", again.content_hash)
    assert world.store.handover_leads("robust:handover-1") == []
    assert world.store.queue_depths().get("robust", {}).get("dispatched", 0) == 0


def test_the_bookkeeping_of_a_collection_is_one_transaction(
    world: World, fleet: SourceCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from investigations.store import collections

    lead_id = world.lead()
    _dispatched(world, lead_id)

    def crash(*args, **kwargs):
        raise Killed

    # Killed after the collection row was written, before the queue row was closed: both roll back.
    monkeypatch.setattr(collections, "finish_dispatched_rows", crash)
    with pytest.raises(Killed):
        world.collector(fleet).collect("robust", lead_id, run_id="run-killed")
    assert world.store.collection("robust", lead_id) is None
    assert world.store.handover_leads("robust:handover-1") == [lead_id]


# -- what a collection says of its lead's changes ----------------------------------------------------

CHANGING = """\
sources:
  - name: changing
    adapter: json_api
    lead_kinds: [domain]
    request: {{url: "{base}/changing/api/lookup?kind={{kind}}&q={{value}}"}}
    parse: {{records_path: results, record_key: id}}
    recrawl: {{min: 1h, max: 30d, every: 6h}}
"""


def test_each_collection_with_records_is_a_visit_of_its_lead_with_its_rate_kept(world: World) -> None:
    from investigations.sandbox import SandboxConfig, start_in_thread
    from investigations.sandbox.changing import ChangeModel
    from investigations.scheduling.cadence import change_rate, prior_rate_per_s

    model = ChangeModel(7)
    lead = next(normalize_lead("domain", f"lead{n}.example") for n in range(1000)
                if model.rate_per_s("domain", f"lead{n}.example") > 1 / (12 * 3600))
    change = model.changes("domain", lead.value, T0.timestamp(), T0.timestamp() + 30 * 86_400)[0]
    handle = start_in_thread(SandboxConfig(changing_clock=lambda: world.clock.now.timestamp()))
    try:
        catalog = parse_sources(CHANGING.format(base=handle.url), env={})
        collector = world.collector(catalog)
        first = collector.collect("changing", world.lead(lead))
        world.clock.now = datetime.fromtimestamp(change, UTC) - timedelta(seconds=1)
        same = collector.collect("changing", lead.id)
        world.clock.now = datetime.fromtimestamp(change, UTC)
        changed = collector.collect("changing", lead.id)
    finally:
        handle.stop()
    assert (first.changed, same.changed, changed.changed) == (True, False, True)
    history = world.store.change_history("changing", lead.id)
    assert history is not None and [changed for _, changed in history.visits] == [False, True]
    assert history.seen_hash == changed.content_hash
    spec = catalog.get("changing")
    (row,) = world.store.cadence_leads("changing", lead_kinds=["domain"], prior_s=spec.recrawl.prior_s)
    assert row.rate_per_s == change_rate(history.visits, prior_rate_per_s(spec))
