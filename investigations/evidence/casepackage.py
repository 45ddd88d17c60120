"""A case's evidence package: its records, the answers they were read from, and a manifest.

`export_case` writes, for every lead of a case, into a folder laid out like the data dir:
- each source's record file (`records/<source>/<lead_id>.parquet`) and every WARC file its records
  point at (`evidence/<source>/<date>/<file>.warc.gz`);
- `empty_answers.csv`: every collection of the case that came back empty (a record file with no
  records: the source's "nothing here", or an OK answer with nothing in it), one row per answer it
  captured (source, lead, capture id, WARC file, offset, url, HTTP status, fetched_at, digests),
  with that collection's WARC file in the package too. The state store does not say which WARC
  file an empty collection wrote, so it is found by its name and warcinfo (source, lead-id): the
  newest one whose answers were all fetched by the collection's last success (`find_empty_answer`);
- `sources.json`: the spec of every source in the package as the sources file says at export,
  secrets masked (`redacted_spec`), and its adapter's parser version: what it takes to read each
  answer again;
- `datapackage.json`, a manifest in the style of WACZ's: each file's path, size in bytes and
  `sha256:<hex>` hash;
- `datapackage-digest.json`: the manifest's own sha256, signed with the operator's key when asked
  (`evidence.signing`, in the shape of WACZ signing's anonymous signature).

Digests: a payload digest is shown as `sha256:<hex>` everywhere (the records' `payload_sha256`
column holds the bare hex). A WARC record's WARC-Payload-Digest is the same sha256 of the same
payload, written `sha256:<base32>`; where one is shown, its hex is shown beside it.

`verify_package` checks a package without trusting any of it but the manifest:
- every file is re-hashed against the manifest (and no file is left out of it);
- every record's capture is read back from its WARC file at its offset (it must be the record's
  capture, for the record's URL, with the record's payload sha256 and WARC-Payload-Digest), then
  read again with its source's adapter, rebuilt from `sources.json`: the capture must yield the
  record (same key, url and fields) and the record's file every record the capture yields. A
  record of another parser version than the adapter's today cannot be read again with today's
  code: it is listed in `not_rechecked`, "not re-checked (parser version X, current Y)";
- every empty answer's capture is read back the same way, and read again: the source's rules must
  call it "nothing here", or it must be an OK answer that yields no records. A record file with no
  records and no empty answer to show for it is a problem.
It returns every problem found, each naming the file, the record (or empty answer) and what differs.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import ValidationError

from investigations.adapters import Adapter, ParsedRecord, ParseError, TtlCache, build_adapter
from investigations.collection.classify import Answer
from investigations.config import Settings
from investigations.evidence.canonical import canonical_json
from investigations.evidence.captures import (
    EVIDENCE_DIR,
    SOFTWARE,
    WARC_SUFFIX,
    StoredCapture,
    digest_header_hex,
    read_capture,
    read_responses,
    read_warcinfo,
    redact_headers,
    sha256_digest_header,
)
from investigations.evidence.records import RecordStore
from investigations.evidence.signing import DIGEST_FILE, check_digest, fingerprint, write_digest
from investigations.net.redaction import MASK, SECRETS, redact_url
from investigations.sources.catalog import load_catalog
from investigations.sources.specs import SourceCatalog, SourceSpec
from investigations.store import StateStore

MANIFEST = "datapackage.json"
PROFILE = "data-package"
SOURCES_FILE = "sources.json"
EMPTY_ANSWERS_FILE = "empty_answers.csv"
DIGESTS_NOTE = ("A payload digest is shown as sha256:<hex>. A WARC record's WARC-Payload-Digest is the same sha256 of "
                "the same payload, written sha256:<base32> (RFC 4648 base32); the records' payload_sha256 column holds "
                "the bare hex.")
SOURCES_NOTE = ("The spec of each source in this package as the sources file said at export, secrets masked as "
                f"{MASK}, and its adapter's parser version then: verify rebuilds each source's adapter from its spec "
                "and reads every record again from its capture.")
# empty_answers.csv: (column, Table Schema type, description).
EMPTY_ANSWER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("source", "string", "the source asked"),
    ("lead_id", "string", "the lead it was asked about"),
    ("capture_id", "string", "the WARC-Record-ID of the response"),
    ("warc_file", "string", "the WARC file holding it, relative to the package"),
    ("warc_offset", "integer", "the offset of the response's gzip member in that file"),
    ("capture_url", "string", "the url it answered (redacted)"),
    ("http_status", "integer", "the HTTP status of the answer"),
    ("fetched_at", "string", "when it was fetched: the response's WARC-Date"),
    ("payload_sha256", "string", "sha256 of the payload, sha256:<hex>"),
    ("warc_payload_digest", "string", "the response's WARC-Payload-Digest: the same sha256, sha256:<base32>"),
    ("note", "string", "why there is no capture, when there is none"),
)
EMPTY_ANSWER_COLUMNS = tuple(name for name, _, _ in EMPTY_ANSWER_FIELDS)


@dataclass(frozen=True)
class ExportResult:
    folder: Path
    leads: int
    record_files: int
    records: int
    warc_files: int
    bytes: int
    empty_answers: int = 0  # rows of empty_answers.csv: answers of collections that came back empty
    sources: int = 0  # sources in sources.json
    signed_by: str | None = None  # the signing key's fingerprint (None: the digest is not signed)


@dataclass
class VerifyResult:
    files: int = 0
    records: int = 0
    problems: list[str] = field(default_factory=list)
    rechecked: int = 0  # records read again from their capture with their source's adapter
    empty_answers: int = 0  # rows of empty_answers.csv checked
    # Records (and empty answers) that could not be read again with today's code, each with why;
    # not a mismatch, and not a match either.
    not_rechecked: list[str] = field(default_factory=list)
    # The fingerprint of the key whose valid signature covers the manifest (None: not signed).
    signed_by: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class EmptyAnswer:
    """What a collection that came back empty captured: its WARC file and the answers in it, or why
    they were not found (`note`)."""

    source: str
    lead_id: str
    warc_file: str | None  # relative to the data dir
    captures: tuple[StoredCapture, ...] = ()
    note: str = ""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_case(store: StateStore, data_dir: str | os.PathLike[str], case_id: str,
                folder: str | os.PathLike[str], *, catalog: SourceCatalog | None = None,
                signing_key: ec.EllipticCurvePrivateKey | None = None) -> ExportResult:
    """Write case `case_id`'s package into `folder` (created; it must not hold anything yet).

    `catalog`: the sources whose specs go into `sources.json` (default: the configured sources file).
    `signing_key`: the operator's key, to sign the manifest's digest with (`evidence.signing`).
    Raises KeyError for an unknown case, FileExistsError for a folder that is not empty, and
    FileNotFoundError when a record points at a WARC file that is not there.
    """
    if case_id not in {case["case_id"] for case in store.cases_overview()}:
        raise KeyError(f"unknown case {case_id!r}")
    data_dir, out = Path(data_dir), Path(folder)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: export into a new folder")
    if catalog is None:
        catalog = load_catalog(Settings.from_env().sources_path)
    records = RecordStore(data_dir / "records")
    leads = [row["lead_id"] for row in store.leads_overview() if case_id in row["cases"]]
    copied: list[str] = []
    warc_files: set[str] = set()
    sources: set[str] = set()
    empty: list[EmptyAnswer] = []
    record_count = 0
    for lead_id in leads:
        for path in sorted(records.root.glob(f"*/{lead_id}.parquet")):
            relative = path.relative_to(data_dir).as_posix()
            _copy(path, out / relative)
            copied.append(relative)
            sources.add(path.parent.name)
            table = pq.read_table(out / relative, columns=["warc_file"])
            record_count += table.num_rows
            warc_files.update(name for name in table.column("warc_file").to_pylist() if name)
            if table.num_rows == 0:
                empty.append(find_empty_answer(store, data_dir, path.parent.name, lead_id))
    warc_files.update(answer.warc_file for answer in empty if answer.warc_file)
    for relative in sorted(warc_files):
        source = data_dir / relative
        if not source.is_file():
            raise FileNotFoundError(f"the records (or an empty answer) point at {relative}, which is not in "
                                    f"{data_dir}")
        _copy(source, out / relative)
    out.mkdir(parents=True, exist_ok=True)
    (out / SOURCES_FILE).write_text(json.dumps(_sources_document(catalog, sorted(sources)), indent=2) + "\n",
                                    encoding="utf-8")
    rows = [row for answer in empty for row in _empty_answer_rows(answer)]
    _write_csv(out / EMPTY_ANSWERS_FILE, rows)
    resources = [_resource(out, relative) for relative in copied]
    resources.append({**_resource(out, SOURCES_FILE), "description": SOURCES_NOTE})
    resources.append({**_resource(out, EMPTY_ANSWERS_FILE), "format": "csv",
                      "description": "Answers of the case's collections that came back empty: evidence of emptiness.",
                      "schema": {"fields": [{"name": n, "type": t, "description": d}
                                            for n, t, d in EMPTY_ANSWER_FIELDS]}})
    resources += [_resource(out, relative) for relative in sorted(warc_files)]
    manifest: dict[str, Any] = {
        "profile": PROFILE,
        "name": f"case-{case_id}",
        "title": f"Evidence of case {case_id}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "software": SOFTWARE,
        "case_id": case_id,
        "leads": leads,
        "sources": SOURCES_FILE,
        "empty_answers": EMPTY_ANSWERS_FILE,
        "digests": DIGESTS_NOTE,
        "resources": resources,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    write_digest(out, MANIFEST, software=SOFTWARE, version=package_version(), key=signing_key)
    return ExportResult(out, len(leads), len(copied), record_count, len(warc_files),
                        sum(r["bytes"] for r in resources), empty_answers=len(rows), sources=len(sources),
                        signed_by=fingerprint(signing_key.public_key()) if signing_key else None)


def package_version() -> str:
    """This software's version, as its package metadata says."""
    try:
        return metadata.version("investigations-fleet")
    except metadata.PackageNotFoundError:
        return "unknown"


def find_empty_answer(store: StateStore, data_dir: str | os.PathLike[str], source: str, lead_id: str) -> EmptyAnswer:
    """The WARC file (and its answers) of the collection of (`source`, `lead_id`) whose record file
    holds no records.

    The state store keeps no WARC file for a collection and an empty record file has no row to
    point at one, so it is found by name (`evidence/<source>/<date>/<lead_id>-*.warc.gz`, its
    warcinfo naming the source and lead): of the files whose answers were all fetched by the
    collection's last success, the newest. Later files are later attempts that failed or were parked.
    """
    collection = store.collection(source, lead_id)
    if collection is None or collection.last_success_at is None:
        return EmptyAnswer(source, lead_id, None,
                           note="the state store has no successful collection of this source and lead")
    until = collection.last_success_at
    root = Path(data_dir)
    best: tuple[datetime, Path, list[StoredCapture]] | None = None
    for path in sorted((root / EVIDENCE_DIR / source).glob(f"*/{lead_id}-*{WARC_SUFFIX}")):
        try:
            info, answers = read_warcinfo(path), read_responses(path)
        except (OSError, ValueError):
            continue
        times = [a.fetched_at for a in answers if a.fetched_at is not None]
        if info.get("source") != source or info.get("lead-id") != lead_id or not times or max(times) > until:
            continue
        if best is None or max(times) > best[0]:
            best = (max(times), path, answers)
    if best is None:
        return EmptyAnswer(source, lead_id, None,
                           note=f"no WARC file of this source and lead under {EVIDENCE_DIR}/{source}/ holds answers "
                                f"fetched by its last successful collection ({until.isoformat()})")
    return EmptyAnswer(source, lead_id, best[1].relative_to(root).as_posix(), tuple(best[2]))


def redacted_spec(spec: SourceSpec) -> dict[str, Any]:
    """`spec` as JSON, safe to hand over: every registered secret masked wherever it is, the request's
    url redacted, its credential headers and bearer token `***` (as the WARC request records have them)."""
    data: dict[str, Any] = _mask_secrets(spec.model_dump(mode="json"))
    request = data["request"]
    request["url"] = redact_url(request["url"])
    request["headers"] = dict(redact_headers(request["headers"]))
    if request.get("bearer_token"):
        request["bearer_token"] = MASK
    return data


def verify_package(folder: str | os.PathLike[str], *, expected_key: ec.EllipticCurvePublicKey | None = None
                   ) -> VerifyResult:
    """Check the package in `folder` against its manifest, the manifest against its digest (and the
    digest's signature, when signed; with `expected_key`, it must be signed by that key), its records
    against their captures and its empty answers against theirs; the result lists every mismatch
    (empty when the package is intact) and every record that could not be read again (`not_rechecked`)."""
    out = Path(folder)
    result = VerifyResult()
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        resources = {r["path"]: r for r in manifest["resources"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        result.problems.append(f"{MANIFEST}: unreadable manifest ({type(exc).__name__}: {exc})")
        return result
    digest_check = check_digest(out, MANIFEST, expected_key=expected_key)
    result.problems += digest_check.problems
    result.signed_by = digest_check.fingerprint
    for relative, resource in resources.items():
        path = out / relative
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            result.problems.append(f"{relative}: a manifest path must stay inside the package")
            continue
        if not path.is_file():
            result.problems.append(f"{relative}: listed in the manifest but missing")
            continue
        result.files += 1
        size, digest = path.stat().st_size, f"sha256:{file_sha256(path)}"
        if size != resource.get("bytes"):
            result.problems.append(f"{relative}: {size} bytes, the manifest says {resource.get('bytes')}")
        if digest != resource.get("hash"):
            result.problems.append(f"{relative}: hash {digest} does not match the manifest's {resource.get('hash')}")
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        relative = path.relative_to(out).as_posix()
        if relative not in (MANIFEST, DIGEST_FILE) and relative not in resources:
            result.problems.append(f"{relative}: in the package but not in the manifest")
    readers = _Readers(out, resources, result)
    empty_files: dict[tuple[str, str], str] = {}
    for relative in sorted(r for r in resources if r.endswith(".parquet") and (out / r).is_file()):
        if _verify_records(out, relative, resources, readers, result) == 0:
            empty_files[(Path(relative).parent.name, Path(relative).stem)] = relative
    _verify_empty_answers(out, resources, readers, empty_files, result)
    return result


class _Readers:
    """Each source's adapter, rebuilt from the package's `sources.json`, or why it cannot be."""

    def __init__(self, out: Path, resources: dict[str, Any], result: VerifyResult) -> None:
        self._result = result
        self._adapters: dict[str, Adapter | str] = {}
        self._specs: dict[str, Any] = {}
        self._why_none: str | None = None
        self._absent = SOURCES_FILE not in resources or not (out / SOURCES_FILE).is_file()
        if self._absent:
            self._why_none = f"the package has no {SOURCES_FILE}"
            return
        try:
            document = json.loads((out / SOURCES_FILE).read_text(encoding="utf-8"))
            self._specs = {entry["name"]: entry for entry in document["sources"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._why_none = f"{SOURCES_FILE} is unreadable"
            result.problems.append(f"{SOURCES_FILE}: unreadable ({type(exc).__name__}: {exc})")

    def adapter(self, source: str) -> Adapter | str:
        """The adapter of `source`, or why there is none (the first time, a problem when the package
        should have had it)."""
        if source not in self._adapters:
            self._adapters[source] = self._build(source)
        return self._adapters[source]

    def _build(self, source: str) -> Adapter | str:
        if self._why_none is not None:
            if self._absent:  # a package is exported with one: without it, nothing it claims is re-derived
                self._result.problems.append(f"{SOURCES_FILE}: not in the package: the records of {source!r} cannot "
                                             "be read again from their captures")
            return self._why_none
        entry = self._specs.get(source)
        if entry is None:
            self._result.problems.append(f"{SOURCES_FILE}: holds no entry for source {source!r}")
            return f"no spec of source {source!r} in {SOURCES_FILE}"
        if entry.get("spec") is None:
            return f"no spec of source {source!r} in {SOURCES_FILE}: {entry.get('note') or 'none was exported'}"
        try:
            spec = SourceSpec.model_validate(entry["spec"])
            if spec.name != source:
                self._result.problems.append(f"{SOURCES_FILE}: the entry of source {source!r} holds the spec of "
                                             f"{spec.name!r}")
                return f"the spec of source {source!r} in {SOURCES_FILE} is another source's"
            return build_adapter(spec, cache=TtlCache())
        except (ValidationError, KeyError, TypeError, ValueError) as exc:
            self._result.problems.append(f"{SOURCES_FILE}: the spec of source {source!r} does not load "
                                         f"({type(exc).__name__}: {exc})")
            return f"the spec of source {source!r} in {SOURCES_FILE} does not load"


def _verify_records(out: Path, relative: str, resources: dict[str, Any], readers: _Readers,
                    result: VerifyResult) -> int | None:
    """Check one record file's records; how many it holds (None when it cannot be read)."""
    try:
        rows = pq.read_table(out / relative).to_pylist()
    except Exception as exc:  # noqa: BLE001 - a damaged Parquet file fails in many ways
        result.problems.append(f"{relative}: unreadable records ({type(exc).__name__}: {exc})")
        return None
    parts = Path(relative).parts
    source, lead_id = (parts[1], Path(relative).stem) if len(parts) == 3 else (None, None)
    if source is None and rows:
        result.problems.append(f"{relative}: not at records/<source>/<lead_id>.parquet: its records cannot be "
                               "read again with their source's adapter")
    captures = _Captures(out)
    derived: dict[tuple[str, int], list[ParsedRecord]] = {}
    for row in rows:
        result.records += 1
        name = f"{relative} record {row.get('record_key')!r}"
        if (row.get("source"), row.get("lead_id")) != (source, lead_id):
            result.problems.append(f"{name}: is a record of {row.get('source')}/{row.get('lead_id')}, "
                                   f"not of the file's {source}/{lead_id}")
        warc_file, offset, expected = row.get("warc_file"), row.get("warc_offset"), row.get("payload_sha256")
        if not warc_file or offset is None or not expected:
            result.problems.append(f"{name}: has no capture to verify against")
            continue
        if warc_file not in resources:
            result.problems.append(f"{name}: points at {warc_file}, which is not in the manifest")
            continue
        where = f"{warc_file}@{offset}"
        stored = captures.read(warc_file, offset)
        if isinstance(stored, str):
            result.problems.append(f"{name}: {where}: {stored}")
            continue
        intact = _check_capture(name, where, stored, capture_id=row.get("capture_id"), url=row.get("capture_url"),
                                payload_sha256=expected, result=result)
        if row.get("fetched_at") != stored.fetched_at:
            result.problems.append(f"{name}: fetched_at {row.get('fetched_at')} does not match the WARC-Date "
                                   f"{stored.warc_date} of {where}")
        if intact and source is not None:
            _rederive(name, where, row, source, stored, readers, derived, result)
    _check_all_held(relative, {row.get("record_key") for row in rows}, derived, result)
    return len(rows)


def _check_all_held(relative: str, keys: set[Any], derived: dict[tuple[str, int], list[ParsedRecord]],
                    result: VerifyResult) -> None:
    """A collection stores every record its answers yield (the first of a key): none may be missing."""
    for (warc_file, offset), parsed in sorted(derived.items()):
        for record in parsed:
            if record.key not in keys:
                result.problems.append(f"{relative}: its capture {warc_file}@{offset} yields record {record.key!r}, "
                                       "which the file does not hold")


class _Captures:
    """WARC records read back once each (many records share one capture), or why they could not be."""

    def __init__(self, out: Path) -> None:
        self._out = out
        self._read: dict[tuple[str, int], StoredCapture | str] = {}

    def read(self, warc_file: str, offset: int) -> StoredCapture | str:
        if (warc_file, offset) not in self._read:
            try:
                self._read[(warc_file, offset)] = read_capture(self._out / warc_file, offset)
            except (OSError, ValueError) as exc:
                self._read[(warc_file, offset)] = str(exc)
        return self._read[(warc_file, offset)]


def _check_capture(name: str, where: str, stored: StoredCapture, *, capture_id: Any, url: Any, payload_sha256: str,
                   result: VerifyResult) -> bool:
    """Is `stored` the capture `name` says (its id, url, payload sha256 and WARC-Payload-Digest)?
    Each difference is a problem; True when the payload is the one named, from the capture named."""
    intact = True
    if stored.record_id != capture_id:
        intact = False
        result.problems.append(f"{name}: {where} is WARC record {stored.record_id}, not its capture {capture_id}")
    if url and stored.target_uri != url:
        result.problems.append(f"{name}: {where} answered {stored.target_uri}, not the {url} it names")
    actual = hashlib.sha256(stored.payload).hexdigest()
    if actual != payload_sha256:
        intact = False
        result.problems.append(f"{name}: payload sha256:{actual} in {where} does not match the record's "
                               f"sha256:{payload_sha256}")
    elif stored.payload_digest != sha256_digest_header(payload_sha256):
        result.problems.append(
            f"{name}: WARC-Payload-Digest {stored.payload_digest} in {where} is "
            f"sha256:{digest_header_hex(stored.payload_digest) or '(unreadable)'} in hex, not the payload's "
            f"sha256:{payload_sha256} (WARC-Payload-Digest is the same sha256 in base32: it should read "
            f"{sha256_digest_header(payload_sha256)})")
    return intact


def _rederive(name: str, where: str, row: dict[str, Any], source: str, stored: StoredCapture, readers: _Readers,
              derived: dict[tuple[str, int], list[ParsedRecord]], result: VerifyResult) -> None:
    """Read the record's capture again with its source's adapter: it must yield the record."""
    adapter = readers.adapter(source)
    if isinstance(adapter, str):
        result.not_rechecked.append(f"{name}: not re-checked ({adapter})")
        return
    version = row.get("parser_version")
    if version != adapter.parser_version:
        result.not_rechecked.append(f"{name}: not re-checked (parser version {version}, "
                                    f"current {adapter.parser_version})")
        return
    key = (row["warc_file"], row["warc_offset"])
    if key not in derived:
        try:
            derived[key] = adapter.parse(stored.payload, url=stored.target_uri or row.get("capture_url") or "")
        except ParseError as exc:
            result.problems.append(f"{name}: its capture {where} does not parse with {source}'s adapter "
                                   f"(parser version {adapter.parser_version}): {exc}")
            return
    result.rechecked += 1
    parsed = next((r for r in derived[key] if r.key == row.get("record_key")), None)
    if parsed is None:
        yielded = sorted(r.key for r in derived[key])
        result.problems.append(f"{name}: its capture {where} yields no record with this key (it yields "
                               f"{len(yielded)}: {_some(yielded)})")
        return
    for difference in _differences(row, parsed):
        result.problems.append(f"{name}: {difference} in its capture {where}")


def _differences(row: dict[str, Any], parsed: ParsedRecord) -> list[str]:
    """How the stored record differs from the one its capture yields, field by field."""
    found = []
    if row.get("url") != parsed.url:
        found.append(f"url is {row.get('url')!r} in the record but {parsed.url!r}")
    stored_text, derived_text = row.get("fields"), canonical_json(parsed.fields)
    if stored_text == derived_text:
        return found
    derived = json.loads(derived_text)
    try:
        stored = json.loads(stored_text) if isinstance(stored_text, str) else None
    except ValueError:
        stored = None
    if not isinstance(stored, dict):
        return [*found, f"fields are {stored_text!r} in the record, not a JSON object, but {derived_text!r}"]
    fields = []
    for name in sorted(set(stored) | set(derived)):
        if name not in derived:
            fields.append(f"field {name!r} is {stored[name]!r} in the record but absent")
        elif name not in stored:
            fields.append(f"field {name!r} is absent from the record but {derived[name]!r}")
        elif stored[name] != derived[name]:
            fields.append(f"field {name!r} is {stored[name]!r} in the record but {derived[name]!r}")
    # Equal values written another way still are not what the fleet wrote.
    return found + (fields or [f"fields are written {stored_text!r} in the record but {derived_text!r}"])


def _verify_empty_answers(out: Path, resources: dict[str, Any], readers: _Readers,
                          empty_files: dict[tuple[str, str], str], result: VerifyResult) -> None:
    """Every record file with no records has the answers of its collection in the package, and each
    one is "nothing here" by its source's rules or an OK answer that yields no records."""
    rows: list[dict[str, str]] = []
    if EMPTY_ANSWERS_FILE in resources and (out / EMPTY_ANSWERS_FILE).is_file():
        try:
            with open(out / EMPTY_ANSWERS_FILE, encoding="utf-8", newline="") as handle:
                rows = list(csv.DictReader(handle))
        except (OSError, ValueError, csv.Error) as exc:
            result.problems.append(f"{EMPTY_ANSWERS_FILE}: unreadable ({type(exc).__name__}: {exc})")
    shown: set[tuple[str, str]] = set()
    for line, row in enumerate(rows, start=2):
        result.empty_answers += 1
        source, lead_id = row.get("source") or "", row.get("lead_id") or ""
        shown.add((source, lead_id))
        name = f"{EMPTY_ANSWERS_FILE} line {line} ({source}/{lead_id})"
        if (source, lead_id) not in empty_files:
            result.problems.append(f"{name}: the package holds no record file of {source}/{lead_id} without records")
        _verify_empty_answer(out, name, row, resources, readers, result)
    for (source, lead_id), relative in sorted(empty_files.items()):
        if (source, lead_id) not in shown:
            result.problems.append(f"{relative}: holds no records, and {EMPTY_ANSWERS_FILE} holds no answer of "
                                   f"{source}/{lead_id} to show that the source answered empty")


def _verify_empty_answer(out: Path, name: str, row: dict[str, str], resources: dict[str, Any], readers: _Readers,
                         result: VerifyResult) -> None:
    warc_file, offset_text, capture_id = row.get("warc_file"), row.get("warc_offset"), row.get("capture_id")
    if not warc_file or not offset_text or not capture_id:
        result.problems.append(f"{name}: no capture of this empty answer ({row.get('note') or 'no reason given'})")
        return
    if warc_file not in resources:
        result.problems.append(f"{name}: points at {warc_file}, which is not in the manifest")
        return
    where = f"{warc_file}@{offset_text}"
    try:
        stored = read_capture(out / warc_file, int(offset_text))
        info = read_warcinfo(out / warc_file)
    except (OSError, ValueError) as exc:
        result.problems.append(f"{name}: {where}: {exc}")
        return
    expected = (row.get("payload_sha256") or "").removeprefix("sha256:")
    if not _check_capture(name, where, stored, capture_id=capture_id, url=row.get("capture_url"),
                          payload_sha256=expected, result=result):
        return
    if row.get("warc_payload_digest") != stored.payload_digest:
        listed, kept = row.get("warc_payload_digest"), stored.payload_digest
        result.problems.append(
            f"{name}: warc_payload_digest {listed} (sha256:{digest_header_hex(listed) or '(unreadable)'} in hex) "
            f"does not match the WARC-Payload-Digest {kept} (sha256:{digest_header_hex(kept) or '(unreadable)'} in "
            f"hex) of {where}; each is a sha256 of the payload written in base32")
    if (info.get("source"), info.get("lead-id")) != (row.get("source"), row.get("lead_id")):
        result.problems.append(f"{name}: {warc_file} is a collection of {info.get('source')}/{info.get('lead-id')}")
    if row.get("http_status") != str(stored.status) or row.get("fetched_at") != stored.warc_date:
        result.problems.append(f"{name}: HTTP {row.get('http_status')} fetched at {row.get('fetched_at')}, but "
                               f"{where} is HTTP {stored.status} fetched at {stored.warc_date}")
    _recheck_empty(name, where, row.get("source") or "", stored, readers, result)


def _recheck_empty(name: str, where: str, source: str, stored: StoredCapture, readers: _Readers,
                   result: VerifyResult) -> None:
    """Read an empty answer again: "nothing here" by the source's rules, or OK and without records."""
    adapter = readers.adapter(source)
    if isinstance(adapter, str):
        result.not_rechecked.append(f"{name}: not re-checked ({adapter})")
        return
    headers = {n.lower(): v for n, v in stored.http_headers}
    status = stored.status or 0
    verdict = adapter.judge(Answer(status, headers, stored.payload), now=datetime.now(UTC))
    if verdict is not None and verdict.empty:
        return  # the source's "nothing here"
    if not 200 <= status < 300:
        result.problems.append(f"{name}: {where} is HTTP {status}, which is neither {source}'s \"nothing here\" "
                               "nor an OK answer")
        return
    try:
        parsed = adapter.parse(stored.payload, url=stored.target_uri or "")
    except ParseError as exc:
        # A collection gives up on an answer it should read records from and cannot: in a collection
        # that came back empty, such an answer only named what to ask next (a bootstrap file).
        result.not_rechecked.append(f"{name}: not re-checked ({where} holds no records to read: {exc})")
        return
    if parsed:
        result.problems.append(f"{name}: {where} yields {len(parsed)} record(s) with {source}'s adapter (parser "
                               f"version {adapter.parser_version}): {_some(sorted(r.key for r in parsed))}; "
                               "it is not an empty answer")


def _sources_document(catalog: SourceCatalog, names: Iterable[str]) -> dict[str, Any]:
    entries: list[dict[str, Any]] = []
    for name in names:
        try:
            spec = catalog.get(name)
        except KeyError:
            entries.append({"name": name, "spec": None, "note": "not in the sources file at export"})
            continue
        entries.append({"name": name, "adapter": spec.adapter,
                        "parser_version": build_adapter(spec, cache=TtlCache()).parser_version,
                        "spec": redacted_spec(spec)})
    return {"note": SOURCES_NOTE, "sources": entries}


def _empty_answer_rows(answer: EmptyAnswer) -> list[dict[str, Any]]:
    if answer.warc_file is None or not answer.captures:
        return [{"source": answer.source, "lead_id": answer.lead_id, "note": answer.note}]
    rows = []
    for capture in answer.captures:
        digest = hashlib.sha256(capture.payload).hexdigest()
        rows.append({
            "source": answer.source, "lead_id": answer.lead_id, "capture_id": capture.record_id,
            "warc_file": answer.warc_file, "warc_offset": capture.offset, "capture_url": capture.target_uri,
            "http_status": capture.status, "fetched_at": capture.warc_date, "payload_sha256": f"sha256:{digest}",
            "warc_payload_digest": capture.payload_digest, "note": answer.note,
        })
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=EMPTY_ANSWER_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({column: "" if row.get(column) is None else row[column] for column in EMPTY_ANSWER_COLUMNS}
                     for row in rows)
    path.write_text(text.getvalue(), encoding="utf-8")


def _mask_secrets(value: Any) -> Any:
    if isinstance(value, str):
        return SECRETS.replace(value)
    if isinstance(value, dict):
        return {k: _mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_secrets(v) for v in value]
    return value


def _some(keys: list[str], shown: int = 5) -> str:
    if not keys:
        return "none"
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(repr(k) for k in keys[:shown]) + more


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _resource(out: Path, relative: str) -> dict[str, Any]:
    path = out / relative
    return {"path": relative, "bytes": path.stat().st_size, "hash": f"sha256:{file_sha256(path)}"}
