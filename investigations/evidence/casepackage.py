"""A case's evidence package: its records, the WARC files they point at, and a manifest.

`export_case` copies, for every lead of a case, each source's record file and every WARC file its
records point at into a folder laid out like the data dir (`records/<source>/<lead_id>.parquet`,
`evidence/<source>/<date>/<file>.warc.gz`), and writes `datapackage.json`, a manifest in the style
of WACZ's: each file's path, size in bytes and `sha256:<hex>` hash.

`verify_package` checks a package without trusting any of it but the manifest: every file is
re-hashed against the manifest (and no file is left out of it), and every record's payload is read
back from its WARC record at its offset (which must be the record's capture, for the record's URL)
and re-hashed against the record's `payload_sha256` (and the record's WARC-Payload-Digest). It
returns every problem found, each naming the file or record.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from investigations.evidence.captures import SOFTWARE, read_capture, sha256_digest_header
from investigations.evidence.records import RecordStore
from investigations.store import StateStore

MANIFEST = "datapackage.json"
PROFILE = "data-package"


@dataclass(frozen=True)
class ExportResult:
    folder: Path
    leads: int
    record_files: int
    records: int
    warc_files: int
    bytes: int


@dataclass
class VerifyResult:
    files: int = 0
    records: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_case(store: StateStore, data_dir: str | os.PathLike[str], case_id: str,
                folder: str | os.PathLike[str]) -> ExportResult:
    """Write case `case_id`'s package into `folder` (created; it must not hold anything yet).

    Raises KeyError for an unknown case, FileExistsError for a folder that is not empty, and
    FileNotFoundError when a record points at a WARC file that is not there.
    """
    if case_id not in {case["case_id"] for case in store.cases_overview()}:
        raise KeyError(f"unknown case {case_id!r}")
    data_dir, out = Path(data_dir), Path(folder)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: export into a new folder")
    records = RecordStore(data_dir / "records")
    leads = [row["lead_id"] for row in store.leads_overview() if case_id in row["cases"]]
    copied: list[str] = []
    warc_files: set[str] = set()
    record_count = 0
    for lead_id in leads:
        for path in sorted(records.root.glob(f"*/{lead_id}.parquet")):
            relative = path.relative_to(data_dir).as_posix()
            _copy(path, out / relative)
            copied.append(relative)
            table = pq.read_table(out / relative, columns=["warc_file"])
            record_count += table.num_rows
            warc_files.update(name for name in table.column("warc_file").to_pylist() if name)
    for relative in sorted(warc_files):
        source = data_dir / relative
        if not source.is_file():
            raise FileNotFoundError(f"the records point at {relative}, which is not in {data_dir}")
        _copy(source, out / relative)
    resources = [_resource(out, relative) for relative in [*copied, *sorted(warc_files)]]
    manifest: dict[str, Any] = {
        "profile": PROFILE,
        "name": f"case-{case_id}",
        "title": f"Evidence of case {case_id}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "software": SOFTWARE,
        "case_id": case_id,
        "leads": leads,
        "resources": resources,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return ExportResult(out, len(leads), len(copied), record_count, len(warc_files),
                        sum(r["bytes"] for r in resources))


def verify_package(folder: str | os.PathLike[str]) -> VerifyResult:
    """Check the package in `folder` against its manifest and its records against their WARC
    records; the result lists every mismatch (empty when the package is intact)."""
    out = Path(folder)
    result = VerifyResult()
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        resources = {r["path"]: r for r in manifest["resources"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        result.problems.append(f"{MANIFEST}: unreadable manifest ({type(exc).__name__}: {exc})")
        return result
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
        if relative != MANIFEST and relative not in resources:
            result.problems.append(f"{relative}: in the package but not in the manifest")
    for relative in sorted(r for r in resources if r.endswith(".parquet") and (out / r).is_file()):
        _verify_records(out, relative, resources, result)
    return result


def _verify_records(out: Path, relative: str, resources: dict[str, Any], result: VerifyResult) -> None:
    try:
        rows = pq.read_table(out / relative).to_pylist()
    except Exception as exc:  # noqa: BLE001 - a damaged Parquet file fails in many ways
        result.problems.append(f"{relative}: unreadable records ({type(exc).__name__}: {exc})")
        return
    for row in rows:
        result.records += 1
        name = f"{relative} record {row.get('record_key')!r}"
        warc_file, offset, expected = row.get("warc_file"), row.get("warc_offset"), row.get("payload_sha256")
        if not warc_file or offset is None or not expected:
            result.problems.append(f"{name}: has no capture to verify against")
            continue
        if warc_file not in resources:
            result.problems.append(f"{name}: points at {warc_file}, which is not in the manifest")
            continue
        try:
            stored = read_capture(out / warc_file, offset)
        except (OSError, ValueError) as exc:
            result.problems.append(f"{name}: {warc_file}@{offset}: {exc}")
            continue
        if stored.record_id != row.get("capture_id"):
            result.problems.append(f"{name}: {warc_file}@{offset} is WARC record {stored.record_id}, "
                                   f"not its capture {row.get('capture_id')}")
        if row.get("capture_url") and stored.target_uri != row["capture_url"]:
            result.problems.append(f"{name}: {warc_file}@{offset} answered {stored.target_uri}, "
                                   f"not the record's {row['capture_url']}")
        actual = hashlib.sha256(stored.payload).hexdigest()
        if actual != expected:
            result.problems.append(f"{name}: payload sha256 {actual} in {warc_file}@{offset} "
                                   f"does not match the record's {expected}")
        elif stored.payload_digest != sha256_digest_header(expected):
            result.problems.append(f"{name}: WARC-Payload-Digest {stored.payload_digest} in {warc_file}@{offset} "
                                   f"does not match the payload")


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def _resource(out: Path, relative: str) -> dict[str, Any]:
    path = out / relative
    return {"path": relative, "bytes": path.stat().st_size, "hash": f"sha256:{file_sha256(path)}"}
