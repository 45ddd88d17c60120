"""A case package proves what it claims: verify reads every record again from its capture with its
source's adapter, keeps the answers of empty collections as evidence of emptiness, and shows a
payload digest as sha256:<hex> with the WARC-Payload-Digest (base32) beside it."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from investigations.adapters.json_api import JsonApiAdapter
from investigations.collection.collect import Collector
from investigations.collection.fetcher import Fetcher, FetchResult
from investigations.evidence.canonical import canonical_json
from investigations.evidence.captures import (
    EvidenceStore,
    digest_header_hex,
    read_responses,
    sha256_digest_header,
)
from investigations.evidence.casepackage import (
    EMPTY_ANSWERS_FILE,
    MANIFEST,
    SOURCES_FILE,
    VerifyResult,
    export_case,
    file_sha256,
    verify_package,
)
from investigations.evidence.records import RecordStore
from investigations.evidence.signing import write_digest
from investigations.intake.leads import normalize_lead
from investigations.sources.catalog import load_catalog
from investigations.sources.specs import SourceCatalog, parse_sources
from investigations.store import StateStore
from tests.investigations.collection.test_collect import T0, Clock

EXAMPLE = normalize_lead("domain", "example.com")
ALICE = normalize_lead("username", "alice")
KEY = "k3y-never-in-a-package"

# Sources beside the repo's own: one behind a key (in its query, its headers and a bearer token), and
# one whose "nothing here" is a 404 (the sandbox has no such path).
EXTRA_SOURCES = """\
  - name: keyed
    adapter: json_api
    lead_kinds: [domain]
    request:
      url: "{sandbox}/robust/api/lookup?kind={{kind}}&q={{value}}&api_key=${{KEYED_KEY}}"
      headers: {{X-Api-Key: "${{KEYED_KEY}}", X-Client: "tenant-${{KEYED_KEY}}", Accept: application/json}}
      bearer_token: "${{KEYED_KEY}}"
    parse:
      records_path: results
      record_key: id
      fields: {{type: type, value: value, first_seen: first_seen, url: source_url}}
  - name: gone
    adapter: json_api
    lead_kinds: [domain]
    request:
      url: "{sandbox}/gone/api/lookup?q={{value}}"
    parse: {{records_path: results, record_key: id}}
    answers: {{empty_statuses: [404]}}
    retry: {{attempts: 1}}
"""


@dataclass
class World:
    data_dir: Path
    store: StateStore
    catalog: SourceCatalog
    collector: Collector
    clock: Clock

    def collect(self, source: str, lead_id: str) -> None:
        self.clock.advance(minutes=1)
        self.collector.collect(source, lead_id)

    def export(self, folder: Path) -> Path:
        export_case(self.store, self.data_dir, "case-1", folder, catalog=self.catalog)
        return folder


@pytest.fixture
def world(sandbox_env: Path, sandbox) -> Iterator[World]:
    """Case `case-1` (example.com and alice) over the sandbox, with a hand-moved clock."""
    text = (Path(__file__).resolve().parents[3] / "sources.yaml").read_text()
    catalog = parse_sources(text + EXTRA_SOURCES.format(sandbox=sandbox.url),
                            env={"INVESTIGATIONS_SANDBOX_URL": sandbox.url, "KEYED_KEY": KEY})
    store = StateStore.from_url(f"sqlite:///{sandbox_env / 'state.db'}")
    for lead in (EXAMPLE, ALICE):
        store.add_lead(lead, case_id="case-1", now=T0)
    fetcher = Fetcher(sink=store, sleep=lambda s: None)
    clock = Clock()
    collector = Collector(catalog=catalog, store=store, records=RecordStore(sandbox_env / "records"),
                          fetcher=fetcher, now=clock, evidence=EvidenceStore(sandbox_env))
    try:
        yield World(sandbox_env, store, catalog, collector, clock)
    finally:
        fetcher.close()
        store.close()


def manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text())


def rewrite(out: Path, relative: str, text_or_table: str | object) -> None:
    """Replace a file of the package and make the manifest's size and hash match it again."""
    if isinstance(text_or_table, str):
        (out / relative).write_text(text_or_table)
    else:
        pq.write_table(text_or_table, out / relative)
    package = manifest(out)
    for resource in package["resources"]:
        if resource["path"] == relative:
            resource["bytes"] = (out / relative).stat().st_size
            resource["hash"] = f"sha256:{file_sha256(out / relative)}"
    (out / MANIFEST).write_text(json.dumps(package))
    write_digest(out, MANIFEST, software="tamperer", version="1")  # an unsigned digest anyone can make again


def empty_answers(out: Path) -> list[dict[str, str]]:
    with open(out / EMPTY_ANSWERS_FILE, newline="") as handle:
        return list(csv.DictReader(handle))


def records_of(out: Path, source: str, lead_id: str) -> tuple[str, list[dict]]:
    relative = f"records/{source}/{lead_id}.parquet"
    return relative, pq.read_table(out / relative).to_pylist()


def assert_intact(result: VerifyResult) -> None:
    assert result.problems == [] and result.not_rechecked == []


# -- the untampered package ------------------------------------------------------------------------


def test_an_untampered_package_verifies_each_record_read_again_from_its_capture(world: World, tmp_path: Path) -> None:
    world.collect("robust", EXAMPLE.id)
    world.collect("quiet", ALICE.id)
    out = world.export(tmp_path / "package")
    result = verify_package(out)
    assert_intact(result)
    assert result.records > 0 and result.rechecked == result.records
    assert result.empty_answers == 1


# -- records: the capture must yield them ------------------------------------------------------------


def test_a_record_value_changed_with_the_manifest_made_to_match_fails_naming_record_and_field(
        world: World, tmp_path: Path) -> None:
    world.collect("robust", EXAMPLE.id)
    out = world.export(tmp_path / "package")
    relative, rows = records_of(out, "robust", EXAMPLE.id)
    table = pq.read_table(out / relative)
    fields = table.column("fields").to_pylist()
    original = json.loads(fields[0])
    fields[0] = canonical_json({**original, "value": "tampered.example"})
    index = table.schema.get_field_index("fields")
    rewrite(out, relative, table.set_column(index, table.schema.field(index), [fields]))

    result = verify_package(out)
    assert not result.ok
    key = rows[0]["record_key"]
    where = f"{rows[0]['warc_file']}@{rows[0]['warc_offset']}"
    assert result.problems == [f"{relative} record {key!r}: field 'value' is 'tampered.example' in the record but "
                               f"{original['value']!r} in its capture {where}"]


def test_a_record_key_changed_fails_as_a_record_its_capture_does_not_yield(world: World, tmp_path: Path) -> None:
    world.collect("robust", EXAMPLE.id)
    out = world.export(tmp_path / "package")
    relative, rows = records_of(out, "robust", EXAMPLE.id)
    table = pq.read_table(out / relative)
    keys = table.column("record_key").to_pylist()
    keys[0] = "made-up-key"
    index = table.schema.get_field_index("record_key")
    rewrite(out, relative, table.set_column(index, table.schema.field(index), [keys]))

    problems = verify_package(out).problems
    assert any(p.startswith(f"{relative} record 'made-up-key': its capture ") and "yields no record with this key" in p
               for p in problems)
    # ... and the record it replaced is now missing from the file.
    assert any(p.endswith(f"yields record {rows[0]['record_key']!r}, which the file does not hold") for p in problems)


def test_a_record_removed_from_its_file_fails_as_one_its_capture_yields(world: World, tmp_path: Path) -> None:
    world.collect("robust", EXAMPLE.id)
    out = world.export(tmp_path / "package")
    relative, rows = records_of(out, "robust", EXAMPLE.id)
    assert len(rows) >= 2
    rewrite(out, relative, pq.read_table(out / relative).slice(1))

    problems = verify_package(out).problems
    assert problems == [f"{relative}: its capture {rows[0]['warc_file']}@{rows[0]['warc_offset']} yields record "
                        f"{rows[0]['record_key']!r}, which the file does not hold"]


def test_a_record_of_an_older_parser_version_is_reported_not_rechecked(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(JsonApiAdapter, "parser_version", "0")
        world.collect("robust", EXAMPLE.id)
    out = world.export(tmp_path / "package")
    relative, rows = records_of(out, "robust", EXAMPLE.id)

    result = verify_package(out)
    assert result.ok and result.rechecked == 0
    assert result.not_rechecked == [f"{relative} record {row['record_key']!r}: not re-checked (parser version 0, "
                                    f"current {JsonApiAdapter.parser_version})" for row in rows]


def test_a_package_without_its_source_specs_fails(world: World, tmp_path: Path) -> None:
    world.collect("robust", EXAMPLE.id)
    out = world.export(tmp_path / "package")
    package = manifest(out)
    package["resources"] = [r for r in package["resources"] if r["path"] != SOURCES_FILE]
    (out / MANIFEST).write_text(json.dumps(package))
    (out / SOURCES_FILE).unlink()

    result = verify_package(out)
    assert f"{SOURCES_FILE}: not in the package: the records of 'robust' cannot be read again from their captures" \
        in result.problems
    assert result.rechecked == 0 and len(result.not_rechecked) == result.records


# -- the specs: what it takes to read an answer again, without secrets --------------------------------


def test_the_package_carries_each_source_s_spec_without_its_secrets(world: World, tmp_path: Path) -> None:
    world.collect("keyed", EXAMPLE.id)
    out = world.export(tmp_path / "package")
    text = (out / SOURCES_FILE).read_text()
    (entry,) = json.loads(text)["sources"]
    request = entry["spec"]["request"]
    assert KEY not in text
    assert request["url"].endswith("&api_key=***") and request["bearer_token"] == "***"
    assert request["headers"] == {"X-Api-Key": "***", "X-Client": "tenant-***", "Accept": "application/json"}
    assert (entry["name"], entry["parser_version"]) == ("keyed", JsonApiAdapter.parser_version)
    # ... and that is enough to read every record again.
    result = verify_package(out)
    assert_intact(result)
    assert result.rechecked == result.records > 0
    assert not any(KEY in p.read_bytes().decode("latin-1") for p in out.rglob("*.json"))


# -- empty answers: evidence of emptiness -------------------------------------------------------------


def test_an_empty_collection_s_capture_is_in_the_package_and_verified(world: World, tmp_path: Path) -> None:
    world.collect("quiet", ALICE.id)
    out = world.export(tmp_path / "package")
    (row,) = empty_answers(out)
    assert (row["source"], row["lead_id"], row["http_status"]) == ("quiet", ALICE.id, "200")
    assert row["warc_file"] in {r["path"] for r in manifest(out)["resources"]}
    (answer,) = read_responses(out / row["warc_file"])
    assert (answer.record_id, str(answer.offset), answer.warc_date) == (
        row["capture_id"], row["warc_offset"], row["fetched_at"])
    assert pq.read_table(out / f"records/quiet/{ALICE.id}.parquet").num_rows == 0

    result = verify_package(out)
    assert_intact(result)
    assert result.empty_answers == 1


def test_the_source_s_nothing_here_is_verified_by_its_own_rules(world: World, tmp_path: Path) -> None:
    world.collect("gone", EXAMPLE.id)
    out = world.export(tmp_path / "package")
    (row,) = empty_answers(out)
    assert (row["source"], row["http_status"]) == ("gone", "404")
    assert_intact(verify_package(out))


def test_the_empty_answer_kept_is_the_last_successful_collection_s(world: World, tmp_path: Path) -> None:
    world.collect("quiet", ALICE.id)
    world.collect("quiet", ALICE.id)
    newest = max(EvidenceStore(world.data_dir).root.glob(f"quiet/*/{ALICE.id}-*.warc.gz"),
                 key=lambda p: read_responses(p)[0].warc_date or "")
    # A later attempt that failed after its answer was captured left a file the records never used.
    later = world.clock.now + timedelta(minutes=5)
    with EvidenceStore(world.data_dir).open("quiet", ALICE.id, now=lambda: later) as evidence:
        evidence.capture(FetchResult(status=200, body=b"not json", url="http://sandbox.test/quiet", attempts=1,
                                     latency_ms=1.0, identity_id="direct"))
    out = world.export(tmp_path / "package")
    (row,) = empty_answers(out)
    assert row["warc_file"] == newest.relative_to(world.data_dir).as_posix()
    assert_intact(verify_package(out))


def test_a_record_file_without_records_and_without_its_empty_answer_fails(world: World, tmp_path: Path) -> None:
    world.collect("quiet", ALICE.id)
    out = world.export(tmp_path / "package")
    header = (out / EMPTY_ANSWERS_FILE).read_text().splitlines()[0]
    rewrite(out, EMPTY_ANSWERS_FILE, header + "\n")
    assert verify_package(out).problems == [
        f"records/quiet/{ALICE.id}.parquet: holds no records, and {EMPTY_ANSWERS_FILE} holds no answer of "
        f"quiet/{ALICE.id} to show that the source answered empty"]


def test_an_empty_answer_whose_capture_yields_records_fails(world: World, tmp_path: Path) -> None:
    world.collect("robust", EXAMPLE.id)
    world.collect("quiet", ALICE.id)
    out = world.export(tmp_path / "package")
    (row,) = empty_answers(out)
    _, records = records_of(out, "robust", EXAMPLE.id)
    # The row made to point at an answer that held records, every digest made to match.
    (answer,) = [a for a in read_responses(out / records[0]["warc_file"]) if a.record_id == records[0]["capture_id"]]
    row.update(capture_id=answer.record_id, warc_file=records[0]["warc_file"], warc_offset=str(answer.offset),
               capture_url=answer.target_uri, fetched_at=answer.warc_date,
               payload_sha256=f"sha256:{records[0]['payload_sha256']}", warc_payload_digest=answer.payload_digest)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(row), lineterminator="\n")
    writer.writeheader()
    writer.writerow(row)
    rewrite(out, EMPTY_ANSWERS_FILE, text.getvalue())

    problems = verify_package(out).problems
    assert any(p.startswith(f"{EMPTY_ANSWERS_FILE} line 2 (quiet/{ALICE.id}): ") and
               f"yields {len(records)} record(s)" in p and p.endswith("it is not an empty answer") for p in problems)


# -- digests: one hash, both spellings shown ----------------------------------------------------------


def test_an_empty_answer_shows_its_payload_digest_as_hex_beside_the_warc_base32(world: World, tmp_path: Path) -> None:
    world.collect("quiet", ALICE.id)
    out = world.export(tmp_path / "package")
    (row,) = empty_answers(out)
    assert row["payload_sha256"] == f"sha256:{digest_header_hex(row['warc_payload_digest'])}"
    assert row["warc_payload_digest"] == sha256_digest_header(row["payload_sha256"].removeprefix("sha256:"))
    described = {f["name"]: f["description"] for r in manifest(out)["resources"] if r["path"] == EMPTY_ANSWERS_FILE
                 for f in r["schema"]["fields"]}
    assert "the same sha256" in described["warc_payload_digest"]
    assert "same sha256" in manifest(out)["digests"]


def test_a_warc_payload_digest_reads_back_as_the_hex_it_was_made_from() -> None:
    hex_digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    assert digest_header_hex(sha256_digest_header(hex_digest)) == hex_digest
    assert digest_header_hex("sha1:AAAA") is None and digest_header_hex(None) is None


def test_export_takes_the_specs_from_the_configured_sources_file(world: World, tmp_path: Path) -> None:
    world.collect("robust", EXAMPLE.id)
    export_case(world.store, world.data_dir, "case-1", tmp_path / "package")  # no catalog given
    (entry,) = json.loads((tmp_path / "package" / SOURCES_FILE).read_text())["sources"]
    configured = load_catalog(Path(__file__).resolve().parents[3] / "sources.yaml").get("robust")
    assert entry["spec"]["parse"] == configured.parse.model_dump(mode="json")
