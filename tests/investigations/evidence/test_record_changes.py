"""What a collection changed in a lead's records, by record key: kept in the change log beside the
records, a first collection is a baseline (not news), nothing is logged when nothing changed, and a
change logged twice (a crash between the log and the file) reads once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from investigations.adapters import ParsedRecord
from investigations.evidence.records import RecordChanges, RecordStore, diff_records

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEAD = "domain-05d504ff83cf98ff"
A = ParsedRecord("a", None, {"value": "192.0.2.7"})
B = ParsedRecord("b", None, {"value": "10 mx1.example.com"})
B2 = ParsedRecord("b", None, {"value": "20 mx2.example.com"})
C = ParsedRecord("c", "https://crt.example/c", {"value": "CN=example.com"})


def _store(tmp_path: Path) -> RecordStore:
    return RecordStore(tmp_path / "data" / "records")


def test_a_lead_s_first_records_are_a_baseline_not_news(tmp_path: Path) -> None:
    written = _store(tmp_path).write("robust", LEAD, [A, B], fetched_at=T0)
    assert written.changes == RecordChanges(added=("a", "b"), first=True) and not written.changes.news


def test_records_added_removed_and_modified_are_named_by_key(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.write("robust", LEAD, [A, B], fetched_at=T0)
    written = store.write("robust", LEAD, [B2, C], fetched_at=T0 + timedelta(hours=1))
    assert written.changes == RecordChanges(added=("c",), removed=("a",), modified=("b",))
    assert written.changes.news


def test_the_same_records_again_change_nothing_and_log_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.write("robust", LEAD, [A, B], fetched_at=T0)
    written = store.write("robust", LEAD, [B, A], fetched_at=T0 + timedelta(hours=1))
    assert written.changes == RecordChanges() and not written.changed
    assert len(store.changes.read([LEAD])) == 1  # the baseline only


def test_the_change_log_reads_each_change_once_oldest_first_with_the_added_records_fields(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.write("robust", LEAD, [A], fetched_at=T0)
    store.write("robust", LEAD, [A, C], fetched_at=T0 + timedelta(hours=2))
    first, second = store.changes.read([LEAD])
    assert first["first"] and first["added"] == ["a"]
    assert not second["first"] and second["added"] == ["c"] and second["added_fields"] == {"c": {"value": "CN=example.com"}}
    assert [c["at"] for c in store.changes.read([LEAD], since=T0 + timedelta(hours=1))] == [T0 + timedelta(hours=2)]


def test_a_change_logged_twice_reads_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.write("robust", LEAD, [A], fetched_at=T0)
    path = store.path_for("robust", LEAD)
    kept = path.read_bytes()
    store.write("robust", LEAD, [A, C], fetched_at=T0 + timedelta(hours=1))
    path.write_bytes(kept)  # the file as if the process died after logging the change, before renaming
    store.write("robust", LEAD, [A, C], fetched_at=T0 + timedelta(hours=2))
    assert [c["added"] for c in store.changes.read([LEAD])] == [["a"], ["c"]]


def test_diffing_without_a_stored_file_is_a_first_collection() -> None:
    assert diff_records(None, {}) == RecordChanges()  # nothing found, nothing to tell
    assert diff_records({}, {"a": (None, "{}")}) == RecordChanges(added=("a",))  # records after an empty answer: news
