"""The record store: one Parquet file per (source, lead), replaced atomically, never appended.

A collection's records are written to a temporary file in the same folder and renamed over the old
file, so a reader sees the old file or the new one, never half of one. Content is hashed without
the fetch time: when a re-run collects the same records, the file is left exactly as it was (same
bytes, same `fetched_at`), which makes re-running any partition safe and visible as "unchanged".
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
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

CONTENT_HASH_KEY = b"investigations.content_hash"

RECORD_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("lead_id", pa.string(), nullable=False),
        pa.field("record_key", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("fetched_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("fields", pa.string(), nullable=False),  # the record's own fields, canonical JSON
    ]
)


class RecordLike(Protocol):
    key: str
    url: str | None
    fields: dict[str, Any]


@dataclass(frozen=True)
class WriteResult:
    path: Path
    records: int
    content_hash: str
    changed: bool  # False when the stored file already held exactly these records


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class RecordStore:
    """Parquet files under `root/<source>/<lead_id>.parquet`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path_for(self, source: str, lead_id: str) -> Path:
        return self.root / source / f"{lead_id}.parquet"

    def write(
        self, source: str, lead_id: str, records: Sequence[RecordLike], *, fetched_at: datetime
    ) -> WriteResult:
        """Store the records of one collection, replacing what was there; a no-op if unchanged."""
        # Duplicate keys keep their first occurrence; sorting makes the file independent of page order.
        by_key: dict[str, RecordLike] = {}
        for record in records:
            by_key.setdefault(record.key, record)
        ordered = [by_key[key] for key in sorted(by_key)]
        field_json = [canonical_json(r.fields) for r in ordered]
        content_hash = hashlib.sha256(
            canonical_json([source, lead_id, [[r.key, r.url, f] for r, f in zip(ordered, field_json)]]).encode()
        ).hexdigest()
        path = self.path_for(source, lead_id)
        if self.stored_hash(path) == content_hash:
            return WriteResult(path, len(ordered), content_hash, changed=False)
        table = pa.table(
            {
                "source": [source] * len(ordered),
                "lead_id": [lead_id] * len(ordered),
                "record_key": [r.key for r in ordered],
                "url": [r.url for r in ordered],
                "fetched_at": [fetched_at] * len(ordered),
                "fields": field_json,
            },
            schema=RECORD_SCHEMA.with_metadata({CONTENT_HASH_KEY: content_hash.encode()}),
        )
        _atomic_write_parquet(table, path)
        return WriteResult(path, len(ordered), content_hash, changed=True)

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
    """Records across every (source, lead) file, newest first, straight from the Parquet files."""
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
    query = (f"SELECT source, lead_id, record_key, url, fetched_at, fields FROM read_parquet(?) {where} "
             f"ORDER BY fetched_at DESC, source, lead_id, record_key LIMIT {int(limit)}")
    with duckdb.connect() as conn:
        cursor = conn.execute(query, params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]
