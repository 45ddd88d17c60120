"""The state store, on SQLite and on Postgres: intake idempotency, the inbox, the fetch log,
collections and dead letters, and the schema version.
"""

from __future__ import annotations

import multiprocessing
import threading
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import func, select

from investigations.collection.events import FetchEvent, Outcome
from investigations.intake.leads import Lead, normalize_lead
from investigations.store import StateStore
from investigations.store import schema as s

ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
EXAMPLE = normalize_lead("domain", "example.com")
ALICE = normalize_lead("username", "@alice")
ACME = normalize_lead("org", "Acme Corp")


def accept(store: StateStore, webhook_id: str, *leads: Lead, case_id: str = "case-1",
           sources: list[str] | None = None, priority_class: str = "normal", now: datetime = T0):
    return store.accept_leads(webhook_id=webhook_id, case_id=case_id, leads=list(leads), sources=sources,
                              priority_class=priority_class, now=now)


def fetch_event(*, source: str = "robust", lead: Lead = EXAMPLE, status: int | None = 200,
                outcome: Outcome = Outcome.OK, latency_ms: float = 10.0, size: int = 100, attempt: int = 1,
                at: datetime = T0) -> FetchEvent:
    return FetchEvent(source=source, lead_id=lead.id, identity_id="direct", url=f"http://127.0.0.1:1/{source}",
                      method="GET", status=status, outcome=outcome, latency_ms=latency_ms, bytes=size,
                      attempt=attempt, at=at, run_id="run-1", error=None if outcome is Outcome.OK else "boom")


def count(store: StateStore, table) -> int:
    with store.engine.begin() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


# -- intake: accept_leads and the inbox ------------------------------------------------------------


def test_accept_leads_reports_new_leads_as_accepted(store: StateStore) -> None:
    result = accept(store, "wh-1", EXAMPLE, ALICE)
    assert sorted(result.accepted) == sorted([EXAMPLE.id, ALICE.id])
    assert result.duplicates == []


def test_a_redelivered_webhook_adds_nothing(store: StateStore) -> None:
    accept(store, "wh-1", EXAMPLE, ALICE)
    again = accept(store, "wh-1", EXAMPLE, ALICE, now=T0 + timedelta(minutes=1))
    assert again.accepted == []
    assert again.duplicates == sorted([EXAMPLE.id, ALICE.id])
    assert count(store, s.inbox) == 2


def test_a_redelivery_with_one_more_lead_accepts_only_that_lead(store: StateStore) -> None:
    accept(store, "wh-1", EXAMPLE)
    again = accept(store, "wh-1", EXAMPLE, ACME)
    assert (again.accepted, again.duplicates) == ([ACME.id], [EXAMPLE.id])


def test_the_same_lead_twice_in_one_webhook_is_one_inbox_row(store: StateStore) -> None:
    result = accept(store, "wh-1", EXAMPLE, normalize_lead("domain", "Example.COM."))
    assert result.accepted == [EXAMPLE.id]
    assert count(store, s.inbox) == 1


def test_a_lead_in_two_cases_is_one_lead_linked_to_both(store: StateStore) -> None:
    accept(store, "wh-1", EXAMPLE, case_id="case-a")
    second = accept(store, "wh-2", EXAMPLE, case_id="case-b")
    [overview] = store.leads_overview()
    assert second.accepted == [EXAMPLE.id]
    assert (overview["lead_id"], overview["cases"]) == (EXAMPLE.id, ["case-a", "case-b"])
    assert [item.case_id for item in store.inbox_after(0, limit=10)] == ["case-a", "case-b"]


def test_inbox_items_carry_the_delivery(store: StateStore) -> None:
    accept(store, "wh-1", ALICE, case_id="case-9", sources=["robust", "flaky", "robust"], priority_class="urgent")
    [item] = store.inbox_after(0, limit=10)
    assert (item.webhook_id, item.case_id, item.lead, item.priority_class) == ("wh-1", "case-9", ALICE, "urgent")
    assert item.sources == ["flaky", "robust"]
    assert item.received_at == T0


def test_inbox_sources_none_means_every_source(store: StateStore) -> None:
    accept(store, "wh-1", ALICE, sources=None)
    assert store.inbox_after(0, limit=10)[0].sources is None


def test_inbox_after_returns_rows_oldest_first_up_to_the_limit(store: StateStore) -> None:
    for n, lead in enumerate([EXAMPLE, ALICE, ACME]):
        accept(store, f"wh-{n}", lead)
    first_page = store.inbox_after(0, limit=2)
    rest = store.inbox_after(first_page[-1].id, limit=2)
    assert [item.lead for item in first_page] == [EXAMPLE, ALICE]
    assert [item.lead for item in rest] == [ACME]
    assert first_page[0].id < first_page[1].id < rest[0].id
    assert store.inbox_after(rest[-1].id, limit=2) == []


def test_last_inbox_id_is_the_newest_row_and_zero_when_empty(store: StateStore) -> None:
    assert store.last_inbox_id() == 0
    accept(store, "wh-1", EXAMPLE)
    accept(store, "wh-2", ALICE)
    assert store.last_inbox_id() == store.inbox_after(0, limit=10)[-1].id


def test_polling_the_inbox_on_sqlite_does_not_wait_for_a_writer(sqlite_store: StateStore) -> None:
    accept(sqlite_store, "wh-1", EXAMPLE)
    newest = sqlite_store.inbox_after(0, limit=10)[-1].id
    writer = StateStore.from_url(str(sqlite_store.engine.url))  # another process's writes, say a run worker's
    polled: list[int] = []
    try:
        with writer.engine.begin() as conn:  # BEGIN IMMEDIATE: the write lock, held until the block ends
            conn.execute(select(func.count()).select_from(s.inbox))
            poll = threading.Thread(target=lambda: polled.append(sqlite_store.last_inbox_id()), daemon=True)
            poll.start()
            poll.join(timeout=5)  # the busy timeout is 30 s: a poll that waited for the lock is still waiting
            assert polled == [newest]
    finally:
        writer.close()


# -- leads ------------------------------------------------------------------------------------------


def test_add_lead_registers_a_lead_without_queueing_it(store: StateStore) -> None:
    store.add_lead(ACME, now=T0)
    assert store.get_lead(ACME.id) == ACME
    assert store.inbox_after(0, limit=10) == []


def test_add_lead_in_a_case_links_it(store: StateStore) -> None:
    store.add_lead(ACME, case_id="case-7")
    store.add_lead(ACME, case_id="case-7")
    assert [(row["lead_id"], row["cases"]) for row in store.leads_overview()] == [(ACME.id, ["case-7"])]


def test_get_lead_of_an_unknown_id_is_none(store: StateStore) -> None:
    assert store.get_lead("domain-0000000000000000") is None


# -- fetch log ----------------------------------------------------------------------------------------


def test_record_fetch_appends_one_row_per_event(store: StateStore) -> None:
    store.record_fetch(fetch_event(status=503, outcome=Outcome.THROTTLED, attempt=1))
    store.record_fetch(fetch_event(status=200, attempt=2, latency_ms=42.5))
    rows = store.fetch_log()
    assert [(r["status"], r["outcome"], r["attempt"]) for r in rows] == [(503, "throttled", 1), (200, "ok", 2)]
    assert rows[1]["latency_ms"] == 42.5 and rows[1]["at"] == T0 and rows[1]["error"] is None


def test_fetch_log_filters_by_source_and_lead_and_limits(store: StateStore) -> None:
    store.record_fetches([fetch_event(source="robust"), fetch_event(source="flaky"),
                          fetch_event(source="robust", lead=ALICE), fetch_event(source="robust", attempt=2)])
    assert [r["source"] for r in store.fetch_log(source="flaky")] == ["flaky"]
    assert len(store.fetch_log(lead_id=ALICE.id)) == 1
    assert len(store.fetch_log(source="robust", lead_id=EXAMPLE.id)) == 2
    assert len(store.fetch_log(limit=3)) == 3


def test_fleet_summary_counts_per_source_since_a_time(store: StateStore) -> None:
    store.record_fetches([
        fetch_event(source="robust", at=T0 - timedelta(hours=2)),  # before the window
        fetch_event(source="robust", latency_ms=10, size=100, at=T0),
        fetch_event(source="robust", latency_ms=30, size=50, status=500, outcome=Outcome.TRANSIENT,
                    at=T0 + timedelta(minutes=5)),
        fetch_event(source="flaky", latency_ms=20, size=7, at=T0 + timedelta(minutes=1)),
    ])
    summary = store.fleet_summary(since=T0 - timedelta(hours=1))
    assert [entry["source"] for entry in summary] == ["flaky", "robust"]
    robust = summary[1]
    assert robust["requests"] == 2
    assert robust["outcomes"] == {"ok": 1, "transient": 1}
    assert robust["bytes"] == 150
    assert robust["last_at"] == T0 + timedelta(minutes=5)


def test_fleet_summary_reports_the_mean_latency_per_source(store: StateStore) -> None:
    store.record_fetches([
        fetch_event(source="robust", latency_ms=10, at=T0),
        fetch_event(source="robust", latency_ms=30, status=500, outcome=Outcome.TRANSIENT, at=T0),
    ])
    [robust] = store.fleet_summary(since=T0)
    assert robust["latency_ms"] == pytest.approx(20.0)


# -- collections and dead letters -------------------------------------------------------------------


def collected(store: StateStore, outcome: str, *, records: int = 3, now: datetime = T0, source: str = "robust") -> None:
    ok = outcome != "failed"
    store.complete_collection(source=source, lead_id=EXAMPLE.id, outcome=outcome, records=records if ok else 0,
                              content_hash="h" * 64 if ok else None, path="/data/x.parquet" if ok else None,
                              run_id=f"run-{outcome}", now=now)


def dead(store: StateStore, *, attempts: int = 2, now: datetime = T0, source: str = "robust",
         reason_group: str = "transient", lead: Lead = EXAMPLE) -> None:
    store.put_dead_letter(source=source, lead_id=lead.id, reason_group=reason_group, last_status=503,
                          attempts=attempts, last_error=f"HTTP 503 at {now:%H:%M}", now=now)


def test_every_finished_collection_adds_its_records_to_its_source_s_running_total(store: StateStore) -> None:
    assert store.records_totals() == {}
    collected(store, "ok", records=3)
    collected(store, "ok", records=3, now=T0 + timedelta(hours=1))  # the same records again count again
    collected(store, "empty", records=0, now=T0 + timedelta(hours=2))
    collected(store, "failed", now=T0 + timedelta(hours=3))
    collected(store, "ok", records=2, source="quiet")
    assert store.records_totals() == {"robust": 6, "quiet": 2}


def test_record_collection_stores_the_latest_success(store: StateStore) -> None:
    collected(store, "ok", records=3)
    got = store.collection("robust", EXAMPLE.id)
    assert (got.outcome, got.records, got.content_hash, got.path) == ("ok", 3, "h" * 64, "/data/x.parquet")
    assert got.last_attempt_at == got.last_success_at == T0


def test_a_failure_after_a_success_keeps_what_the_success_stored(store: StateStore) -> None:
    collected(store, "ok", records=3, now=T0)
    collected(store, "failed", now=T0 + timedelta(hours=1))
    got = store.collection("robust", EXAMPLE.id)
    assert (got.outcome, got.records, got.path, got.run_id) == ("failed", 3, "/data/x.parquet", "run-failed")
    assert (got.last_attempt_at, got.last_success_at) == (T0 + timedelta(hours=1), T0)


def test_a_first_failure_has_no_success_time(store: StateStore) -> None:
    collected(store, "failed")
    assert store.collection("robust", EXAMPLE.id).last_success_at is None


def test_collection_of_nothing_collected_is_none(store: StateStore) -> None:
    assert store.collection("robust", EXAMPLE.id) is None


def test_a_dead_letter_is_stored_with_its_reason(store: StateStore) -> None:
    dead(store, attempts=2)
    [letter] = store.dead_letters()
    assert (letter.source, letter.lead_id, letter.reason_group, letter.last_status, letter.attempts) == (
        "robust", EXAMPLE.id, "transient", 503, 2)
    assert letter.first_seen == letter.last_seen == T0


def test_a_repeated_failure_adds_to_the_attempts_of_one_dead_letter(store: StateStore) -> None:
    dead(store, attempts=2, now=T0)
    dead(store, attempts=3, now=T0 + timedelta(hours=1))
    [letter] = store.dead_letters()
    assert letter.attempts == 5
    assert (letter.first_seen, letter.last_seen) == (T0, T0 + timedelta(hours=1))
    assert letter.last_error == "HTTP 503 at 13:00"


def test_a_success_clears_the_dead_letter(store: StateStore) -> None:
    dead(store)
    collected(store, "ok")
    assert store.dead_letters() == []


def test_an_empty_answer_is_a_success_and_clears_the_dead_letter(store: StateStore) -> None:
    dead(store)
    collected(store, "empty", records=0)
    assert store.dead_letters() == []


def test_a_failure_keeps_the_dead_letter(store: StateStore) -> None:
    dead(store)
    collected(store, "failed")
    assert len(store.dead_letters()) == 1


def test_a_success_clears_only_its_own_dead_letter(store: StateStore) -> None:
    dead(store, source="robust")
    dead(store, source="flaky")
    collected(store, "ok", source="robust")
    assert [letter.source for letter in store.dead_letters()] == ["flaky"]


def test_dead_letters_filter_by_source_and_reason(store: StateStore) -> None:
    dead(store, source="robust", reason_group="transient", now=T0)
    dead(store, source="flaky", reason_group="blocked", now=T0 + timedelta(minutes=1))
    dead(store, source="robust", reason_group="blocked", lead=ALICE, now=T0 + timedelta(minutes=2))
    assert [(d.source, d.lead_id) for d in store.dead_letters()] == [
        ("robust", ALICE.id), ("flaky", EXAMPLE.id), ("robust", EXAMPLE.id)]  # newest first
    assert [d.lead_id for d in store.dead_letters(source="robust")] == [ALICE.id, EXAMPLE.id]
    assert [d.source for d in store.dead_letters(reason_group="blocked")] == ["robust", "flaky"]
    assert [d.lead_id for d in store.dead_letters(source="robust", reason_group="transient")] == [EXAMPLE.id]


# -- schema -----------------------------------------------------------------------------------------


def versions(store: StateStore) -> list[int]:
    with store.engine.begin() as conn:
        return list(conn.scalars(select(s.schema_version.c.version).order_by(s.schema_version.c.version)))


def test_a_new_store_is_at_the_current_schema_version_with_one_row_per_step(store: StateStore) -> None:
    assert store.schema_version == s.SCHEMA_VERSION
    assert versions(store) == list(range(1, s.SCHEMA_VERSION + 1))


def test_reopening_the_store_keeps_data_and_does_not_migrate_again(
    store: StateStore, database: tuple[str, str | None]
) -> None:
    url, schema = database
    accept(store, "wh-1", EXAMPLE)
    reopened = StateStore.from_url(url, schema=schema)
    try:
        assert reopened.schema_version == s.SCHEMA_VERSION
        assert versions(reopened) == list(range(1, s.SCHEMA_VERSION + 1))
        assert [item.lead for item in reopened.inbox_after(0, limit=10)] == [EXAMPLE]
        assert accept(reopened, "wh-1", EXAMPLE).accepted == []
    finally:
        reopened.close()


# -- many processes on one SQLite file --------------------------------------------------------------

WORKERS = 4
WEBHOOKS_PER_WORKER = 25


def _accept_from_worker(url: str, worker: int) -> None:
    """Run in a spawned process: deliver this worker's webhooks one after another."""
    state = StateStore.from_url(url)
    try:
        for n in range(WEBHOOKS_PER_WORKER):
            lead = normalize_lead("username", f"w{worker}_n{n}")
            state.accept_leads(webhook_id=f"wh-{worker}-{n:02d}", case_id=f"case-{worker}", leads=[lead],
                               sources=None, priority_class="normal")
    finally:
        state.close()


def test_concurrent_intake_from_four_processes_keeps_every_row_in_commit_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spawned children import this module by name to find the worker; whatever pytest's import mode,
    # the project root on sys.path (which spawn hands down) makes that name importable.
    monkeypatch.syspath_prepend(str(ROOT))
    url = f"sqlite:///{tmp_path / 'state.db'}"
    StateStore.from_url(url).close()  # migrate once up front, as the deployment does
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_accept_from_worker, args=(url, w)) for w in range(WORKERS)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    assert [process.exitcode for process in workers] == [0] * WORKERS

    state = StateStore.from_url(url)
    try:
        items = state.inbox_after(0, limit=1000)
    finally:
        state.close()
    ids = [item.id for item in items]
    assert len(items) == WORKERS * WEBHOOKS_PER_WORKER
    assert len({item.webhook_id for item in items}) == WORKERS * WEBHOOKS_PER_WORKER
    assert all(a < b for a, b in pairwise(ids))
    for worker in range(WORKERS):
        # Each worker delivers in sequence, so its rows appear in the inbox in that same order.
        mine = [item.webhook_id for item in items if item.case_id == f"case-{worker}"]
        assert mine == [f"wh-{worker}-{n:02d}" for n in range(WEBHOOKS_PER_WORKER)]
