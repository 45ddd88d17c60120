"""Which leads the state store offers to retire from Dagster's partitions, and which to bring back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from investigations.intake.leads import normalize_lead
from investigations.store import StateStore

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SETTLE = timedelta(minutes=5)
RETIRE_AFTER = timedelta(days=7)
A, B = normalize_lead("domain", "a.example"), normalize_lead("domain", "b.example")


def to_retire(store: StateStore, now: datetime) -> list[str]:
    return sorted(store.leads_to_retire(settled_before=now - SETTLE, idle_before=now - RETIRE_AFTER, limit=100))


def collect(store: StateStore, lead_id: str, at: datetime) -> None:
    store.enqueue([("robust", lead_id)], origin=f"test:{at.isoformat()}", priority_class="interactive", now=at)
    store.dispatch("robust", limit=10, now=at)
    store.complete_collection(source="robust", lead_id=lead_id, outcome="ok", records=1, content_hash="h",
                              path="p", run_id="r", now=at)


def test_a_lead_of_an_open_case_is_not_retired(store: StateStore) -> None:
    store.add_lead(A, case_id="case-1", now=T0)
    assert to_retire(store, T0 + timedelta(days=30)) == []


def test_a_closed_case_s_leads_retire_once_it_has_settled(store: StateStore) -> None:
    store.add_leads([A, B], case_id="case-1", now=T0)
    closed_at = T0 + timedelta(hours=1)
    store.set_case_status("case-1", "closed", now=closed_at)
    assert to_retire(store, closed_at + SETTLE - timedelta(seconds=1)) == []
    assert to_retire(store, closed_at + SETTLE + timedelta(seconds=1)) == sorted([A.id, B.id])


def test_a_lead_another_open_case_holds_stays(store: StateStore) -> None:
    store.add_leads([A, B], case_id="case-1", now=T0)
    store.add_lead(A, case_id="case-2", now=T0)
    store.set_case_status("case-1", "closed", now=T0)
    assert to_retire(store, T0 + timedelta(hours=1)) == [B.id]


def test_a_lead_owed_a_collection_stays_until_it_is_collected_and_settled(store: StateStore) -> None:
    store.add_lead(A, case_id="case-1", now=T0)
    store.set_case_status("case-1", "closed", now=T0)
    store.enqueue([("robust", A.id)], origin="backfill:1", priority_class="backfill", now=T0)
    later = T0 + timedelta(hours=1)
    assert to_retire(store, later) == []
    store.dispatch("robust", limit=10, now=later)
    assert to_retire(store, later) == []  # dispatched: a run is collecting it
    store.complete_collection(source="robust", lead_id=A.id, outcome="ok", records=1, content_hash="h",
                              path="p", run_id="r", now=later)
    assert to_retire(store, later + timedelta(minutes=1)) == []  # its run may still be writing
    assert to_retire(store, later + SETTLE + timedelta(seconds=1)) == [A.id]


def test_a_lead_no_case_holds_retires_once_idle_for_the_configured_time(store: StateStore) -> None:
    store.add_lead(A, now=T0)
    collect(store, A.id, T0 + timedelta(days=2))
    assert to_retire(store, T0 + RETIRE_AFTER + timedelta(days=1)) == []  # collected 6 days before
    assert to_retire(store, T0 + timedelta(days=2) + RETIRE_AFTER + timedelta(seconds=1)) == [A.id]


def test_a_retired_lead_is_not_offered_again(store: StateStore) -> None:
    store.add_leads([A, B], case_id="case-1", now=T0)
    store.set_case_status("case-1", "closed", now=T0)
    store.mark_retired([A.id], now=T0 + timedelta(hours=1))
    assert to_retire(store, T0 + timedelta(hours=2)) == [B.id]
    assert store.retired_lead_ids([A.id, B.id]) == {A.id}
    assert store.lead_partition_counts() == {"active": 1, "retired": 1}


def test_the_sync_reads_the_leads_of_open_cases_of_no_case_and_owed_work_only(store: StateStore) -> None:
    held, caseless, owed, closed, retired = (normalize_lead("domain", f"{name}.example")
                                             for name in ("held", "caseless", "owed", "closed", "retired"))
    store.add_leads([held, retired], case_id="open", now=T0)
    store.add_lead(caseless, now=T0)
    store.add_leads([owed, closed], case_id="shut", now=T0)
    store.set_case_status("shut", "closed", now=T0)
    store.mark_retired([retired.id], now=T0)
    store.enqueue([("robust", owed.id)], origin="backfill:1", priority_class="backfill", now=T0)
    assert sorted(store.partition_keys_since(None)) == sorted([held.partition_key, caseless.partition_key,
                                                                owed.partition_key])
    assert store.partition_keys_since(T0 + timedelta(seconds=1)) == []


def test_a_retired_lead_is_brought_back_when_its_case_reopens(store: StateStore) -> None:
    store.add_leads([A, B], case_id="case-1", now=T0)
    store.set_case_status("case-1", "closed", now=T0)
    store.mark_retired([A.id, B.id], now=T0)
    assert store.leads_to_revive(limit=100) == {}
    store.set_case_status("case-1", "active", now=T0 + timedelta(days=1))
    assert sorted(store.leads_to_revive(limit=100)) == sorted([A.id, B.id])
    store.mark_active([A.id, B.id])
    assert store.leads_to_revive(limit=100) == {} and store.lead_partition_counts()["retired"] == 0


def test_a_retired_lead_is_brought_back_when_a_new_case_takes_it_up(store: StateStore) -> None:
    store.add_lead(A, case_id="case-1", now=T0)
    store.set_case_status("case-1", "closed", now=T0)
    store.mark_retired([A.id], now=T0)
    store.accept_leads(webhook_id="w2", case_id="case-2", leads=[A], sources=None, priority_class="interactive",
                       now=T0 + timedelta(days=1))
    assert store.leads_to_revive(limit=100) == {A.id: A.partition_key}


@pytest.mark.parametrize("state", ["queued", "dispatched"])
def test_a_retired_lead_is_brought_back_while_a_collection_is_owed_to_it(store: StateStore, state: str) -> None:
    store.add_lead(A, now=T0)
    store.mark_retired([A.id], now=T0)
    store.enqueue([("robust", A.id)], origin="backfill:1", priority_class="backfill", now=T0)
    if state == "dispatched":
        store.dispatch("robust", limit=10, now=T0)
    assert store.leads_to_revive(limit=100) == {A.id: A.partition_key}


def test_a_retired_lead_keeps_its_collections_and_cases(store: StateStore) -> None:
    store.add_lead(A, case_id="case-1", now=T0)
    collect(store, A.id, T0)
    store.set_case_status("case-1", "closed", now=T0)
    store.mark_retired([A.id], now=T0 + timedelta(hours=1))
    (row,) = [lead for lead in store.leads_overview() if lead["lead_id"] == A.id]
    assert row["cases"] == ["case-1"] and row["collections"]["robust"]["records"] == 1
    assert store.get_lead(A.id) == A
