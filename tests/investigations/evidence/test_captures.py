"""Evidence: a real collection over loopback keeps every answer as WARC, and each record points at its own."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from investigations.collection.collect import Collector
from investigations.collection.fetcher import Fetcher
from investigations.evidence.captures import EvidenceStore, evidence_bytes_by_source, read_capture, sha256_digest_header
from investigations.evidence.records import RecordStore
from investigations.sandbox.proxy import start_proxies
from investigations.sources.specs import parse_sources
from investigations.store import StateStore
from tests.investigations.collection.test_collect import EXAMPLE, LOOKUP, ROOT, SECRET, T0, Clock
from tests.investigations.collection.test_fetcher_identities import _lone_identity_world


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def collector(sqlite_store: StateStore, data_dir: Path, sandbox) -> Iterator[Collector]:
    # The repo's own sources (pointed at the sandbox) and `lookup`, a key in its query and headers.
    lookup = LOOKUP.format(base=f"{sandbox.url}/robust/api/lookup").removeprefix("sources:\n")
    catalog = parse_sources((ROOT / "sources.yaml").read_text() + lookup,
                            env={"INVESTIGATIONS_SANDBOX_URL": sandbox.url, "LOOKUP_KEY": SECRET})
    fetcher = Fetcher(sink=sqlite_store, sleep=lambda s: None)
    sqlite_store.add_lead(EXAMPLE, case_id="case-1", now=T0)
    try:
        yield Collector(catalog=catalog, store=sqlite_store,
                        records=RecordStore(data_dir / "records"), fetcher=fetcher, now=Clock(),
                        evidence=EvidenceStore(data_dir))
    finally:
        fetcher.close()


def rows(collector: Collector, source: str) -> list[dict]:
    table = collector.records.read(source, EXAMPLE.id)
    assert table is not None
    return table.to_pylist()


def test_every_record_payload_digest_is_its_warc_records(collector: Collector, data_dir: Path) -> None:
    collector.collect("robust", EXAMPLE.id)
    records = rows(collector, "robust")
    assert records
    for row in records:
        stored = read_capture(data_dir / row["warc_file"], row["warc_offset"])
        assert stored.record_id == row["capture_id"]
        assert hashlib.sha256(stored.payload).hexdigest() == row["payload_sha256"]
        assert stored.payload_digest == sha256_digest_header(row["payload_sha256"])


def test_a_record_carries_url_identity_time_and_parser_version(collector: Collector, sandbox) -> None:
    collector.collect("robust", EXAMPLE.id)
    row = rows(collector, "robust")[0]
    assert row["capture_url"].startswith(f"{sandbox.url}/robust/api/lookup?")
    assert (row["identity_id"], row["parser_version"], row["fetched_at"]) == ("direct", "1", T0)
    assert row["warc_file"].startswith("evidence/robust/2025-03-01/") and row["warc_file"].endswith(".warc.gz")


def test_the_warc_file_holds_a_request_and_a_response_per_answer(collector: Collector, data_dir: Path) -> None:
    collector.collect("robust", EXAMPLE.id)
    path = data_dir / rows(collector, "robust")[0]["warc_file"]
    with open(path, "rb") as handle:
        kinds = [record.rec_type for record in ArchiveIterator(handle)]
    assert kinds == ["warcinfo", "response", "request"]


def test_a_rerun_writes_a_new_capture_keeps_the_old_one_and_points_at_the_new(
        collector: Collector, data_dir: Path) -> None:
    first = collector.collect("robust", EXAMPLE.id)
    old = rows(collector, "robust")[0]
    collector.now.now = T0 + timedelta(hours=6)  # type: ignore[attr-defined]
    again = collector.collect("robust", EXAMPLE.id)
    new = rows(collector, "robust")[0]
    assert (again.changed, again.content_hash) == (False, first.content_hash)
    assert new["warc_file"] != old["warc_file"] and new["capture_id"] != old["capture_id"]
    assert (data_dir / old["warc_file"]).is_file() and (data_dir / new["warc_file"]).is_file()
    assert read_capture(data_dir / new["warc_file"], new["warc_offset"]).record_id == new["capture_id"]


def test_no_secret_reaches_the_warc_file(collector: Collector, data_dir: Path) -> None:
    collector.collect("lookup", EXAMPLE.id)
    warc_file = rows(collector, "lookup")[0]["warc_file"]
    text = gzip.open(data_dir / warc_file).read().decode("utf-8", "replace")
    lowered = text.lower()  # httpx sends header names in lower case
    assert "get /robust/api/lookup?" in lowered and "api_key=***" in lowered
    assert "authorization: ***" in lowered and "x-client: tenant-***" in lowered
    assert SECRET not in text


def test_evidence_bytes_are_counted_per_source(collector: Collector, data_dir: Path) -> None:
    collector.collect("robust", EXAMPLE.id)
    collector.collect("lookup", EXAMPLE.id)
    sizes = evidence_bytes_by_source(data_dir)
    on_disk = sum(p.stat().st_size for p in (data_dir / "evidence" / "robust").rglob("*.warc.gz"))
    assert set(sizes) == {"robust", "lookup"} and sizes["robust"] == on_disk > 0


def test_no_temporary_file_is_left_after_a_collection(collector: Collector, data_dir: Path) -> None:
    collector.collect("robust", EXAMPLE.id)
    assert [p.name for p in (data_dir / "evidence").rglob("*") if p.name.startswith(".")] == []


def test_a_proxied_identity_is_named_and_its_proxy_password_never_written(
        sandbox, sqlite_store: StateStore, tmp_path: Path) -> None:
    password = "proxy-pa55word-of-the-fleet"
    with start_proxies(["127.0.0.6"], credentials=("fleet", password)) as guarded:
        lone = _lone_identity_world(sandbox, sqlite_store, tmp_path, f"http://fleet:${{PW}}@{guarded[0].host}:"
                                    f"{guarded[0].port}", env={"PW": password})
        try:
            lead_id = lone.lead("proxied.example")
            lone.collector.collect("robust", lead_id)
        finally:
            lone.fetcher.close()
            lone.pool.close()
        assert guarded[0].stats.forwarded == 1
    row = lone.records.read("robust", lead_id).to_pylist()[0]
    assert row["identity_id"] == "px_lone"
    text = gzip.open(tmp_path / row["warc_file"]).read().decode("utf-8", "replace")
    assert "Investigations-Identity-ID: px_lone" in text
    assert password not in text and "fleet:" not in text
