"""`investigations export` and `verify`: a case's evidence package, and what verify catches."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from investigations.cli import main
from investigations.collection.collect import Collector
from investigations.collection.fetcher import Fetcher
from investigations.config import Settings
from investigations.evidence.captures import EvidenceStore
from investigations.evidence.records import RecordStore
from investigations.intake.leads import normalize_lead
from investigations.sources.catalog import load_catalog
from investigations.store import StateStore

EXAMPLE = normalize_lead("domain", "example.com")
ALICE = normalize_lead("username", "alice")


@pytest.fixture
def collected(sandbox_env: Path) -> Iterator[Settings]:
    """Case `case-1` with two leads collected from the sandbox, and an unrelated lead in another case."""
    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    other = normalize_lead("domain", "other.example")
    for lead, case in ((EXAMPLE, "case-1"), (ALICE, "case-1"), (other, "case-2")):
        store.add_lead(lead, case_id=case)
    fetcher = Fetcher(sink=store, sleep=lambda s: None)
    collector = Collector(catalog=load_catalog(settings.sources_path), store=store,
                          records=RecordStore(settings.records_dir), fetcher=fetcher,
                          evidence=EvidenceStore(settings.data_dir))
    try:
        for lead in (EXAMPLE, ALICE, other):
            collector.collect("robust", lead.id)
        collector.collect("robust", EXAMPLE.id)  # a re-run: its first capture stays, unexported
        yield settings
    finally:
        fetcher.close()
        store.close()


def export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "package"
    assert main(["export", "--case", "case-1", str(out)]) == 0
    capsys.readouterr()
    return out


def manifest(out: Path) -> dict:
    return json.loads((out / "datapackage.json").read_text())


def test_export_writes_records_warc_files_and_a_manifest(collected: Settings, tmp_path: Path, capsys) -> None:
    out = export(tmp_path, capsys)
    paths = [r["path"] for r in manifest(out)["resources"]]
    assert sorted(p for p in paths if p.endswith(".parquet")) == sorted(
        [f"records/robust/{EXAMPLE.id}.parquet", f"records/robust/{ALICE.id}.parquet"])
    # One capture per lead: the records point at the re-run's, not at the one it replaced.
    assert len([p for p in paths if p.endswith(".warc.gz")]) == 2
    for resource in manifest(out)["resources"]:
        assert resource["bytes"] == (out / resource["path"]).stat().st_size
        assert resource["hash"].startswith("sha256:")


def test_export_then_verify_passes(collected: Settings, tmp_path: Path, capsys) -> None:
    out = export(tmp_path, capsys)
    assert main(["verify", str(out)]) == 0
    assert "all match" in capsys.readouterr().out


def test_a_closed_case_whose_leads_retired_still_exports_and_lists_its_records(
    collected: Settings, tmp_path: Path, capsys
) -> None:
    store = StateStore.from_url(collected.database_url)
    store.set_case_status("case-1", "closed")
    store.mark_retired([EXAMPLE.id, ALICE.id])  # no longer Dagster partitions
    store.close()
    out = export(tmp_path, capsys)
    assert sorted(p for p in (r["path"] for r in manifest(out)["resources"]) if p.endswith(".parquet")) == sorted(
        [f"records/robust/{EXAMPLE.id}.parquet", f"records/robust/{ALICE.id}.parquet"])
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    assert main(["records", "--lead", "domain:example.com"]) == 0
    assert "no records" not in capsys.readouterr().out
    assert main(["leads", "list"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if EXAMPLE.id in line]
    assert "case-1 (retired)" in row


def test_verify_fails_after_one_byte_of_a_warc_file_changes(collected: Settings, tmp_path: Path, capsys) -> None:
    out = export(tmp_path, capsys)
    warc = next(r["path"] for r in manifest(out)["resources"] if r["path"].endswith(".warc.gz"))
    data = bytearray((out / warc).read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / warc).write_bytes(bytes(data))
    assert main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{warc}: hash" in err and "FAILED verification" in err


def test_verify_fails_after_one_record_changes(collected: Settings, tmp_path: Path, capsys) -> None:
    out = export(tmp_path, capsys)
    path = out / "records" / "robust" / f"{EXAMPLE.id}.parquet"
    table = pq.read_table(path)
    fields = table.column("fields").to_pylist()
    fields[0] = fields[0].replace("example.com", "elsewhere.example")
    pq.write_table(table.set_column(table.schema.get_field_index("fields"), "fields", [fields]), path)
    assert main(["verify", str(out)]) == 1
    assert f"records/robust/{EXAMPLE.id}.parquet: " in capsys.readouterr().err


def test_verify_checks_each_payload_against_its_warc_record(collected: Settings, tmp_path: Path, capsys) -> None:
    """A record whose payload digest was changed and the manifest re-made to match still fails."""
    from investigations.evidence.casepackage import file_sha256

    out = export(tmp_path, capsys)
    relative = f"records/robust/{EXAMPLE.id}.parquet"
    table = pq.read_table(out / relative)
    digests = table.column("payload_sha256").to_pylist()
    digests[0] = "0" * 64
    index = table.schema.get_field_index("payload_sha256")
    pq.write_table(table.set_column(index, table.schema.field(index), [digests]), out / relative)
    package = manifest(out)
    for resource in package["resources"]:
        if resource["path"] == relative:
            resource["bytes"] = (out / relative).stat().st_size
            resource["hash"] = f"sha256:{file_sha256(out / relative)}"
    (out / "datapackage.json").write_text(json.dumps(package))
    assert main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert "does not match the record's sha256:" + "0" * 64 in err


def test_export_refuses_an_unknown_case_and_a_folder_in_use(collected: Settings, tmp_path: Path, capsys) -> None:
    assert main(["export", "--case", "nope", str(tmp_path / "a")]) == 2
    assert "unknown case 'nope'" in capsys.readouterr().err
    export(tmp_path, capsys)
    assert main(["export", "--case", "case-1", str(tmp_path / "package")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_records_captures_shows_each_records_capture(collected: Settings, capsys) -> None:
    assert main(["records", "--lead", "domain:example.com", "--captures", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["capture_id"].startswith("<urn:uuid:") and r["warc_file"] for r in rows)
    assert main(["records", "--lead", "domain:example.com", "--captures"]) == 0
    table = capsys.readouterr().out
    assert rows[0]["capture_id"] in table and f"{rows[0]['warc_file']}@{rows[0]['warc_offset']}" in table


def test_an_operator_signs_a_package_with_their_key_and_a_verifier_checks_it_against_it(
        collected: Settings, tmp_path: Path, capsys, monkeypatch) -> None:
    key_file = tmp_path / "keys" / "signing.pem"
    key_file.parent.mkdir()
    assert main(["signing-key", str(key_file)]) == 0
    made = capsys.readouterr().out
    (shown,) = [line.removeprefix("fingerprint ") for line in made.splitlines() if line.startswith("fingerprint ")]
    public = tmp_path / "signing.pub"
    public.write_text(made[made.index("-----BEGIN PUBLIC KEY-----"):])
    monkeypatch.setenv("INVESTIGATIONS_SIGNING_KEY", str(key_file))
    out = tmp_path / "package"
    assert main(["export", "--case", "case-1", "--sign", str(out)]) == 0
    assert f"signed by key {shown}" in capsys.readouterr().out
    assert main(["verify", "--key", str(public), str(out)]) == 0
    assert f"signed by key {shown}: the signature over the manifest is valid" in capsys.readouterr().out
    # The private key is nowhere in the package: only its public half is.
    secret = "".join(key_file.read_text().splitlines()[1:-1])
    assert not [p for p in out.rglob("*") if p.is_file() and secret[:40].encode() in p.read_bytes()]
    # A manifest edited after signing fails, even with its digest made again.
    other = tmp_path / "other.pem"
    assert main(["signing-key", str(other)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("INVESTIGATIONS_SIGNING_KEY", str(other))
    resigned = tmp_path / "resigned"
    assert main(["export", "--case", "case-1", "--sign", str(resigned)]) == 0
    capsys.readouterr()
    assert main(["verify", "--key", str(public), str(resigned)]) == 1
    assert "not by " + shown in capsys.readouterr().err


def test_export_sign_without_a_key_is_a_clear_error_that_writes_nothing(
        collected: Settings, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("INVESTIGATIONS_SIGNING_KEY", raising=False)
    assert main(["export", "--case", "case-1", "--sign", str(tmp_path / "package")]) == 2
    assert "INVESTIGATIONS_SIGNING_KEY is not set" in capsys.readouterr().err
    assert not (tmp_path / "package").exists()


def test_an_unsigned_package_verifies_and_says_it_is_not_signed(collected: Settings, tmp_path: Path, capsys) -> None:
    out = export(tmp_path, capsys)
    assert main(["verify", str(out)]) == 0
    assert "not signed" in capsys.readouterr().out
    key_file = tmp_path / "signing.pem"
    assert main(["signing-key", str(key_file)]) == 0
    capsys.readouterr()
    assert main(["verify", "--key", str(key_file), str(out)]) == 1
    assert "the package is not signed" in capsys.readouterr().err


def test_a_signing_key_is_never_written_over(tmp_path: Path, capsys) -> None:
    key_file = tmp_path / "signing.pem"
    key_file.write_text("mine")
    assert main(["signing-key", str(key_file)]) == 2
    assert "must not exist yet" in capsys.readouterr().err and key_file.read_text() == "mine"
