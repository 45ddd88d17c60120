"""The record store: atomic Parquet files per (source, lead), left untouched when the content is unchanged."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from investigations.adapters import ParsedRecord
from investigations.evidence.captures import Capture
from investigations.evidence.records import PROVENANCE_COLUMNS, RECORD_SCHEMA, RecordStore

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=6)
LEAD = "domain-05d504ff83cf98ff"

RECORDS = [
    ParsedRecord("r2", "https://crt.example/r2", {"type": "cert", "value": "CN=example.com"}),
    ParsedRecord("r1", None, {"value": "192.0.2.7", "type": "dns_a", "nested": {"b": 2, "a": [1, "x"]}}),
    ParsedRecord("r3", "https://dns.example/r3", {"type": "dns_mx", "value": "10 mx1.example.com"}),
]


# Records written without a capture (by hand) carry no provenance.
NO_CAPTURE = dict.fromkeys(PROVENANCE_COLUMNS)


def capture(n: int, at: datetime) -> Capture:
    return Capture(capture_id=f"<urn:uuid:{n}>", warc_file=f"evidence/robust/x/{n}.warc.gz", offset=100 * n,
                   payload_sha256=f"{n:064x}", fetched_at=at, url="https://dns.example/q", identity_id="direct")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_write_stores_one_row_per_record_with_every_column(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write("robust", LEAD, RECORDS, fetched_at=T0)
    rows = store.read("robust", LEAD).to_pylist()
    assert rows == [
        {"source": "robust", "lead_id": LEAD, "record_key": "r1", "url": None, "fetched_at": T0,
         "fields": json.dumps(RECORDS[1].fields, sort_keys=True, separators=(",", ":")), **NO_CAPTURE},
        {"source": "robust", "lead_id": LEAD, "record_key": "r2", "url": "https://crt.example/r2", "fetched_at": T0,
         "fields": '{"type":"cert","value":"CN=example.com"}', **NO_CAPTURE},
        {"source": "robust", "lead_id": LEAD, "record_key": "r3", "url": "https://dns.example/r3", "fetched_at": T0,
         "fields": '{"type":"dns_mx","value":"10 mx1.example.com"}', **NO_CAPTURE},
    ]


def test_fields_round_trip_through_json(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write("robust", LEAD, RECORDS, fetched_at=T0)
    fields = {row["record_key"]: json.loads(row["fields"]) for row in store.read("robust", LEAD).to_pylist()}
    assert fields == {r.key: r.fields for r in RECORDS}


def test_the_file_lives_at_source_and_lead(tmp_path: Path) -> None:
    result = RecordStore(tmp_path).write("robust", LEAD, RECORDS, fetched_at=T0)
    assert result.path == tmp_path / "robust" / f"{LEAD}.parquet"
    assert result.path.exists() and result.records == 3 and result.changed is True


def test_the_file_has_the_record_schema(tmp_path: Path) -> None:
    result = RecordStore(tmp_path).write("robust", LEAD, RECORDS, fetched_at=T0)
    assert pq.read_schema(result.path).remove_metadata().equals(RECORD_SCHEMA)


def test_duplicate_keys_are_stored_once_keeping_the_first(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    later = ParsedRecord("r1", None, {"value": "changed"})
    result = store.write("robust", LEAD, [*RECORDS, later], fetched_at=T0)
    table = store.read("robust", LEAD)
    assert result.records == 3
    assert table.column("record_key").to_pylist() == ["r1", "r2", "r3"]
    assert "changed" not in table.column("fields").to_pylist()[0]


def test_the_same_records_in_another_order_leave_the_file_alone(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    first = store.write("robust", LEAD, RECORDS, fetched_at=T0)
    before = first.path.read_bytes()
    again = store.write("robust", LEAD, list(reversed(RECORDS)), fetched_at=T1)
    assert again.changed is False
    assert again.content_hash == first.content_hash
    assert first.path.read_bytes() == before
    assert set(store.read("robust", LEAD).column("fetched_at").to_pylist()) == {T0}


def test_different_records_replace_the_file(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    first = store.write("robust", LEAD, RECORDS, fetched_at=T0)
    fewer = store.write("robust", LEAD, RECORDS[:1], fetched_at=T1)
    table = store.read("robust", LEAD)
    assert fewer.changed is True and fewer.content_hash != first.content_hash
    assert table.column("record_key").to_pylist() == ["r2"]
    assert table.column("fetched_at").to_pylist() == [T1]


def test_a_changed_field_value_is_a_change(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write("robust", LEAD, RECORDS, fetched_at=T0)
    edited = [RECORDS[0], RECORDS[1], ParsedRecord("r3", RECORDS[2].url, {"type": "dns_mx", "value": "20 mx2"})]
    assert store.write("robust", LEAD, edited, fetched_at=T1).changed is True


def test_two_fresh_writes_of_the_same_records_are_byte_identical(tmp_path: Path) -> None:
    one = RecordStore(tmp_path / "one").write("robust", LEAD, RECORDS, fetched_at=T0)
    two = RecordStore(tmp_path / "two").write("robust", LEAD, list(reversed(RECORDS)), fetched_at=T0)
    assert one.path.read_bytes() == two.path.read_bytes()


def test_empty_records_write_a_zero_row_file_with_the_schema(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    result = store.write("quiet", LEAD, [], fetched_at=T0)
    table = store.read("quiet", LEAD)
    assert result.records == 0 and result.changed is True
    assert table.num_rows == 0
    assert table.schema.remove_metadata().equals(RECORD_SCHEMA)


def test_empty_then_empty_again_is_unchanged(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write("quiet", LEAD, [], fetched_at=T0)
    assert store.write("quiet", LEAD, [], fetched_at=T1).changed is False


def test_read_of_a_lead_never_written_is_none(tmp_path: Path) -> None:
    assert RecordStore(tmp_path).read("robust", LEAD) is None


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RecordStore(tmp_path)
    first = store.write("robust", LEAD, RECORDS, fetched_at=T0)
    before = first.path.read_bytes()

    def half_written(table: pa.Table, where, **kwargs) -> None:
        where.write(b"PAR1 half a file")  # the crash comes after some bytes reached the temp file
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", half_written)
    with pytest.raises(OSError, match="disk full"):
        store.write("robust", LEAD, RECORDS[:1], fetched_at=T1)
    assert first.path.read_bytes() == before
    assert leftovers(first.path.parent) == []


def test_a_failed_first_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    store = RecordStore(tmp_path)
    with pytest.raises(OSError):
        store.write("robust", LEAD, RECORDS, fetched_at=T0)
    assert list((tmp_path / "robust").iterdir()) == []


def test_a_corrupt_stored_file_is_rewritten(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    path = store.path_for("robust", LEAD)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not parquet at all")
    result = store.write("robust", LEAD, RECORDS, fetched_at=T0)
    assert result.changed is True
    assert store.read("robust", LEAD).num_rows == 3


def test_query_records_reads_across_sources_and_filters(tmp_path) -> None:
    from dataclasses import dataclass
    from datetime import UTC, datetime

    from investigations.evidence.records import RecordStore, query_records

    @dataclass
    class Rec:
        key: str
        url: str | None
        fields: dict

    store = RecordStore(tmp_path)
    at = datetime(2026, 12, 1, tzinfo=UTC)
    store.write("robust", "domain-1", [Rec("a", None, {"value": "mx.example.com"})], fetched_at=at)
    store.write("flaky", "domain-1", [Rec("b", None, {"title": "Hello"})], fetched_at=at)
    store.write("flaky", "domain-2", [Rec("c", None, {"title": "Other"})], fetched_at=at)
    assert len(query_records(tmp_path)) == 3
    assert {r["source"] for r in query_records(tmp_path, lead_id="domain-1")} == {"robust", "flaky"}
    assert [r["record_key"] for r in query_records(tmp_path, source="flaky", contains="hello")] == ["b"]
    assert query_records(tmp_path, source="nothing-here") == []


def test_records_carry_the_capture_they_were_parsed_from(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write("robust", LEAD, RECORDS, fetched_at=T0, captures=[capture(1, T1)] * 3, parser_version="2")
    row = store.read("robust", LEAD).to_pylist()[0]
    assert {name: row[name] for name in PROVENANCE_COLUMNS} == {
        "capture_id": "<urn:uuid:1>", "capture_url": "https://dns.example/q", "warc_file": "evidence/robust/x/1.warc.gz",
        "warc_offset": 100, "payload_sha256": f"{1:064x}", "identity_id": "direct", "parser_version": "2"}
    assert row["fetched_at"] == T1


def test_the_same_records_from_a_new_capture_are_unchanged_and_point_at_it(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    first = store.write("robust", LEAD, RECORDS, fetched_at=T0, captures=[capture(1, T0)] * 3)
    again = store.write("robust", LEAD, RECORDS, fetched_at=T1, captures=[capture(2, T1)] * 3)
    assert (again.changed, again.content_hash) == (False, first.content_hash)
    assert set(store.read("robust", LEAD).column("capture_id").to_pylist()) == {"<urn:uuid:2>"}
    assert leftovers(tmp_path / "robust") == []


def test_records_and_captures_must_pair_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="3 record"):
        RecordStore(tmp_path).write("robust", LEAD, RECORDS, fetched_at=T0, captures=[capture(1, T0)])


def test_query_records_reads_files_from_before_records_carried_a_capture(tmp_path: Path) -> None:
    from investigations.evidence.records import query_records

    store = RecordStore(tmp_path)
    store.write("robust", LEAD, RECORDS[:1], fetched_at=T0, captures=[capture(1, T1)])
    old = pa.table({"source": ["flaky"], "lead_id": [LEAD], "record_key": ["old"], "url": [None],
                    "fetched_at": pa.array([T0], pa.timestamp("us", tz="UTC")), "fields": ["{}"]})
    (tmp_path / "flaky").mkdir()
    pq.write_table(old, tmp_path / "flaky" / f"{LEAD}.parquet")
    rows = {row["record_key"]: row for row in query_records(tmp_path)}
    assert rows["r2"]["capture_id"] == "<urn:uuid:1>" and rows["old"]["capture_id"] is None
