"""The record store: one Parquet file per (source, lead), replaced atomically, never appended.

A collection's records are written to a temporary file in the same folder and renamed over the old
file, so a reader sees the old file or the new one, never half of one. Content is hashed without
the fetch time or the capture: a re-run that collects the same records is reported "unchanged"
(`changed=False`, same content hash), which makes re-running any partition safe and visible as such.

Each record carries its provenance (captures.py): the capture it was parsed from (the WARC
response's record id, file, offset and payload sha256, the URL and identity it was fetched as,
when) and the adapter's parser version. A re-run's records point at the re-run's own capture, so
with captures the file is rewritten even when its content is unchanged; without captures (records
written by hand) an unchanged file is left exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from investigations.evidence.canonical import canonical_json

if TYPE_CHECKING:
    from investigations.evidence.captures import Capture

CONTENT_HASH_KEY = b"investigations.content_hash"

RECORD_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("lead_id", pa.string(), nullable=False),
        pa.field("record_key", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("fetched_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("fields", pa.string(), nullable=False),  # the record's own fields, canonical JSON
        # Provenance (evidence.Capture); null for records written without a capture.
        pa.field("capture_id", pa.string()),  # the WARC-Record-ID of the response parsed
        pa.field("capture_url", pa.string()),  # the url it answered (redacted); `url` is the record's own link
        pa.field("warc_file", pa.string()),  # relative to the data dir
        pa.field("warc_offset", pa.int64()),
        pa.field("payload_sha256", pa.string()),
        pa.field("identity_id", pa.string()),
        pa.field("parser_version", pa.string()),
    ]
)
PROVENANCE_COLUMNS = ("capture_id", "capture_url", "warc_file", "warc_offset", "payload_sha256", "identity_id",
                      "parser_version")


class RecordLike(Protocol):
    @property
    def key(self) -> str: ...
    @property
    def url(self) -> str | None: ...
    @property
    def fields(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RecordChanges:
    """What a collection changed in a lead's stored records, by record key. `first`: the lead had no
    records from the source before, so everything is `added` as a baseline, not as news."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()  # the same key, with another url or other fields
    first: bool = False

    @property
    def news(self) -> bool:
        """Whether this is something to tell an investigator: a change to records seen before."""
        return not self.first and bool(self.added or self.removed or self.modified)


@dataclass(frozen=True)
class WriteResult:
    path: Path
    records: int
    content_hash: str
    changed: bool  # False when the stored file already held exactly these records
    # What changed, by record key (nothing when `changed` is False).
    changes: RecordChanges = RecordChanges()


class RecordStore:
    """Parquet files under `root/<source>/<lead_id>.parquet`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path_for(self, source: str, lead_id: str) -> Path:
        return self.root / source / f"{lead_id}.parquet"

    def write(
        self, source: str, lead_id: str, records: Sequence[RecordLike], *, fetched_at: datetime,
        captures: Sequence[Capture] | None = None, parser_version: str | None = None,
    ) -> WriteResult:
        """Store the records of one collection, replacing what was there.

        `captures[i]` is the capture `records[i]` was parsed from; a record's `fetched_at` is its
        capture's (else `fetched_at`). Without captures, writing unchanged content is a no-op.
        """
        if captures is not None and len(captures) != len(records):
            raise ValueError(f"{len(records)} record(s) but {len(captures)} capture(s)")
        # Duplicate keys keep their first occurrence; sorting makes the file independent of page order.
        by_key: dict[str, tuple[RecordLike, Capture | None]] = {}
        for n, record in enumerate(records):
            by_key.setdefault(record.key, (record, captures[n] if captures is not None else None))
        ordered = [by_key[key][0] for key in sorted(by_key)]
        seen = [by_key[key][1] for key in sorted(by_key)]
        field_json = [canonical_json(r.fields) for r in ordered]
        content_hash = hashlib.sha256(
            canonical_json([source, lead_id, [[r.key, r.url, f] for r, f in zip(ordered, field_json, strict=True)]]).encode()
        ).hexdigest()
        path = self.path_for(source, lead_id)
        stored_hash = self.stored_hash(path)
        unchanged = stored_hash == content_hash
        if unchanged and captures is None:
            return WriteResult(path, len(ordered), content_hash, changed=False)
        changes = RecordChanges()
        if not unchanged:
            before = self._stored_records(path)
            changes = diff_records(before, {r.key: (r.url, f) for r, f in zip(ordered, field_json, strict=True)})
            if changes.added or changes.removed or changes.modified:
                # The change first, then the file: a crash between them logs the change again on the next
                # collection (the log keeps one line per from -> to content), never loses it.
                self.changes.append(source, lead_id, changes, at=fetched_at, before=stored_hash, after=content_hash,
                                    fields={r.key: f for r, f in zip(ordered, field_json, strict=True)})
        table = pa.table(
            {
                "source": [source] * len(ordered),
                "lead_id": [lead_id] * len(ordered),
                "record_key": [r.key for r in ordered],
                "url": [r.url for r in ordered],
                "fetched_at": [c.fetched_at if c is not None else fetched_at for c in seen],
                "fields": field_json,
                "capture_id": [c.capture_id if c is not None else None for c in seen],
                "capture_url": [c.url if c is not None else None for c in seen],
                "warc_file": [c.warc_file if c is not None else None for c in seen],
                "warc_offset": [c.offset if c is not None else None for c in seen],
                "payload_sha256": [c.payload_sha256 if c is not None else None for c in seen],
                "identity_id": [c.identity_id if c is not None else None for c in seen],
                "parser_version": [parser_version] * len(ordered),
            },
            schema=RECORD_SCHEMA.with_metadata({CONTENT_HASH_KEY: content_hash.encode()}),
        )
        _atomic_write_parquet(table, path)
        return WriteResult(path, len(ordered), content_hash, changed=not unchanged, changes=changes)

    @property
    def changes(self) -> ChangeLog:
        """The log of what changed, beside the records (`<data dir>/changes`)."""
        return ChangeLog(self.root.parent / "changes")

    @staticmethod
    def _stored_records(path: Path) -> dict[str, tuple[str | None, str]] | None:
        """The stored file's records as key -> (url, fields JSON); None when there is no file."""
        try:
            table = pq.read_table(path, columns=["record_key", "url", "fields"])
        except (FileNotFoundError, pa.ArrowInvalid):
            return None
        return {key: (url, fields) for key, url, fields in zip(
            table.column("record_key").to_pylist(), table.column("url").to_pylist(),
            table.column("fields").to_pylist(), strict=True)}

    def read(self, source: str, lead_id: str) -> pa.Table | None:
        path = self.path_for(source, lead_id)
        return pq.read_table(path) if path.exists() else None

    @staticmethod
    def stored_hash(path: Path) -> str | None:
        try:
            metadata = pq.read_schema(path).metadata or {}
        except (FileNotFoundError, pa.ArrowInvalid):
            return None
        value = metadata.get(CONTENT_HASH_KEY)
        return value.decode() if value else None


def diff_records(before: dict[str, tuple[str | None, str]] | None,
                 after: dict[str, tuple[str | None, str]]) -> RecordChanges:
    """What changed between two versions of a lead's records (key -> (url, fields JSON)); `before` is
    None for a lead with no file yet (a first collection: its records are a baseline)."""
    if before is None:
        return RecordChanges(added=tuple(sorted(after)), first=bool(after))
    return RecordChanges(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        modified=tuple(sorted(key for key in after.keys() & before.keys() if after[key] != before[key])),
    )


# A change line names at most this many added records with their fields (a lead that gains
# thousands of records at once is counted, and its first ones shown).
MAX_DETAILED = 50


class ChangeLog:
    """What each collection changed in a lead's records, one JSON line per change in
    `<root>/<source>/<lead_id>.jsonl`, appended; read back deduplicated by (before, after) content."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def append(self, source: str, lead_id: str, changes: RecordChanges, *, at: datetime, before: str | None,
               after: str, fields: dict[str, str]) -> None:
        line = json.dumps({
            "at": at.isoformat(), "source": source, "lead_id": lead_id, "before": before, "after": after,
            "first": changes.first, "added": list(changes.added), "removed": list(changes.removed),
            "modified": list(changes.modified),
            "added_fields": {key: json.loads(fields[key]) for key in changes.added[:MAX_DETAILED]},
        }, sort_keys=True)
        path = self.root / source / f"{lead_id}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read(self, lead_ids: Sequence[str], *, since: datetime | None = None) -> list[dict[str, Any]]:
        """Every change of these leads (across sources) at or after `since`, oldest first."""
        seen, out = set(), []
        # Each lead's file in each source's folder, looked up by name: not every file of the fleet.
        sources = sorted(folder for folder in self.root.iterdir() if folder.is_dir()) if self.root.is_dir() else []
        paths = [path for folder in sources for lead_id in sorted(set(lead_ids))
                 if (path := folder / f"{lead_id}.jsonl").is_file()]
        for path in paths:
            for text in path.read_text(encoding="utf-8").splitlines():
                try:
                    change = json.loads(text)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash mid-write
                at = datetime.fromisoformat(change["at"])
                identity = (change["source"], change["lead_id"], change["before"], change["after"])
                if identity in seen or (since is not None and at < since):
                    continue
                seen.add(identity)
                out.append(change | {"at": at})
        return sorted(out, key=lambda c: (c["at"], c["source"], c["lead_id"]))


def _atomic_write_parquet(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    # The rename is durable only once the folder entry is on disk too.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def query_records(
    root: str | os.PathLike[str],
    *,
    source: str | None = None,
    lead_id: str | None = None,
    contains: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Records across every (source, lead) file, newest first, straight from the Parquet files.

    Each row has the record's columns and its provenance (PROVENANCE_COLUMNS; None in files
    written before records carried it)."""
    import duckdb

    root = Path(root)
    pattern = root / (source or "*") / f"{lead_id or '*'}.parquet"
    if not any(root.glob(str(pattern.relative_to(root)))):
        return []
    conditions, params = [], [str(pattern)]
    if contains:
        conditions.append("strpos(lower(fields), lower(?)) > 0")
        params.append(contains)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    # union_by_name: files from before provenance columns existed are read alongside newer ones.
    query = (f"SELECT * FROM read_parquet(?, union_by_name = true) {where} "
             f"ORDER BY fetched_at DESC, source, lead_id, record_key LIMIT {int(limit)}")
    with duckdb.connect() as conn:
        cursor = conn.execute(query, params)
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    columns = RECORD_SCHEMA.names
    return [{name: row.get(name) for name in columns} for row in rows]
