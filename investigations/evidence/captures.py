"""Evidence: every answer a collection uses, kept as a WARC response record and its request record.

Each collection writes its own file, `evidence/<source>/<YYYY-MM-DD>/<lead_id>-<uuid>.warc.gz` under
the data dir: created under a temporary name at its first capture, renamed into place when the
collection ends, never opened for writing again. One writer per file, so concurrent runs (and a
batch run's threads, one collection each) never share one, and a re-run adds a file instead of
rewriting one: old captures stay, they are evidence of what the source said then.

Every record the collection stores points at the response it was parsed from (`Capture`): the
response's WARC-Record-ID, the file (relative to the data dir, so an export keeps the same layout),
the offset of its gzip member, and the sha256 of its payload, which is also its WARC-Payload-Digest.

What is written is what the fleet saw, minus what must never be written:
- the request record names the identity, never its proxy or credentials: Authorization, cookies and
  any header whose name says key/token/secret are `***`, every value and URL goes through
  `redaction.redact` (secrets by value), and the target URL through `redact_url`;
- the response's Set-Cookie values (an identity's session) are `***` as well.
The payload is the body as the fetcher read it, with its content-encoding already undone (httpx
decodes it), so the response record's headers drop Content-Encoding and Transfer-Encoding and give
the decoded length: a WARC reader sees a payload that matches its own headers.

Reading back (what a case package's verification does): `read_capture` (the record at a capture's
offset), `read_responses` (every answer of one collection's file, with offsets) and `read_warcinfo`
(the file's source and lead-id). A record's `payload_sha256` is hex; the WARC-Payload-Digest header
holds the same sha256 in base32 (`sha256_digest_header` writes one from the other,
`digest_header_hex` reads it back).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Self
from urllib.parse import urlsplit

from warcio.archiveiterator import ArchiveIterator
from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeaders
from warcio.utils import Digester
from warcio.warcwriter import WARCWriter

from investigations.net.redaction import MASK, redact, redact_url

if TYPE_CHECKING:
    from investigations.collection.fetcher import FetchResult

EVIDENCE_DIR = "evidence"
WARC_SUFFIX = ".warc.gz"
SOFTWARE = "investigations-fleet"
# Who sent the request: an identity id, never its proxy or credentials (an extension field).
IDENTITY_HEADER = "Investigations-Identity-ID"
# Headers whose value is a credential whatever it looks like; any name containing one of the parts
# below is treated the same, so a source's own `X-Api-Key` or `X-Auth-Token` is covered too.
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
_SECRET_HEADER_PARTS = ("auth", "cookie", "key", "token", "secret", "password", "session", "signature")
# The body is stored decoded (see the module docstring): these would describe bytes not stored.
_DROPPED_RESPONSE_HEADERS = frozenset({"content-encoding", "transfer-encoding", "content-length"})


@dataclass(frozen=True)
class Capture:
    """Where the answer a record was parsed from is kept, and what it was."""

    capture_id: str  # the response record's WARC-Record-ID
    warc_file: str  # relative to the data dir, with forward slashes
    offset: int  # of the response record's gzip member in the file
    payload_sha256: str  # hex; the record's WARC-Payload-Digest is the same digest
    fetched_at: datetime
    url: str  # redacted
    identity_id: str


class _Sha256Writer(WARCWriter):
    """warcio's writer, with sha256 block and payload digests instead of its default sha1."""

    @staticmethod
    def _create_digester() -> Digester:
        return Digester("sha256")


def is_secret_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in _SECRET_HEADERS or any(part in lowered for part in _SECRET_HEADER_PARTS)


def redact_headers(headers: dict[str, str]) -> list[tuple[str, str]]:
    """Headers safe to write: credentials by name as `***`, every other value through `redact`."""
    return [(name, MASK if is_secret_header(name) else redact(value)) for name, value in headers.items()]


class EvidenceStore:
    """The WARC files under `data_dir/evidence/`, one per collection."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self.root = self.data_dir / EVIDENCE_DIR

    def open(self, source: str, lead_id: str, *, now: Callable[[], datetime]) -> CaptureFile:
        """The file one collection's captures go to; nothing is created until the first capture."""
        return CaptureFile(self, source, lead_id, now=now)

    def path(self, warc_file: str) -> Path:
        """The absolute path of a capture's `warc_file`."""
        return self.data_dir / warc_file

    def bytes_by_source(self) -> dict[str, int]:
        """Bytes of evidence kept per source (every WARC file, every run): what captures cost in
        storage, for the cost figures next to requests and proxy traffic."""
        return evidence_bytes_by_source(self.data_dir)


def evidence_bytes_by_source(data_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Bytes of WARC files kept per source under `data_dir/evidence/` (sources with none absent)."""
    root = Path(data_dir) / EVIDENCE_DIR
    totals: dict[str, int] = {}
    if not root.is_dir():
        return totals
    for source_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        size = sum(f.stat().st_size for f in source_dir.rglob(f"*{WARC_SUFFIX}") if f.is_file())
        if size:
            totals[source_dir.name] = size
    return totals


class CaptureFile:
    """One collection's WARC file. Thread-safe; `close()` renames it into place (a no-op when
    nothing was captured), after which it is never written again."""

    def __init__(self, store: EvidenceStore, source: str, lead_id: str, *, now: Callable[[], datetime]) -> None:
        self._store = store
        self._source = source
        self._lead_id = lead_id
        self._now = now
        self._lock = threading.Lock()
        self._handle: io.BufferedWriter | None = None
        self._tmp: Path | None = None
        self._closed = False
        self._warc: WARCWriter | None = None
        self.warc_file: str | None = None  # relative to the data dir, once the first capture is in

    def capture(self, response: FetchResult) -> Capture:
        """Write `response` (and the request it answers) and say where it is."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the evidence file {self.warc_file} is closed")
            fetched_at = self._now()
            writer = self._writer(fetched_at)
            assert self._handle is not None and self.warc_file is not None
            url = redact_url(response.url)
            digest = hashlib.sha256(response.body).hexdigest()
            warc_date = fetched_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            headers = [(n, MASK if n.lower() == "set-cookie" else redact(v)) for n, v in response.headers.items()
                       if n.lower() not in _DROPPED_RESPONSE_HEADERS]
            headers.append(("Content-Length", str(len(response.body))))
            reason = _reason(response.status)
            answer = writer.create_warc_record(
                url, "response", payload=io.BytesIO(response.body), length=len(response.body),
                http_headers=StatusAndHeaders(f"{response.status} {reason}", headers, protocol="HTTP/1.1"),
                warc_headers_dict={"WARC-Date": warc_date, IDENTITY_HEADER: response.identity_id},
            )
            parts = urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            request = writer.create_warc_record(
                url, "request",
                http_headers=StatusAndHeaders(f"{response.method} {target} HTTP/1.1",
                                              redact_headers(response.request_headers),
                                              protocol="HTTP/1.1", is_http_request=True),
                warc_headers_dict={"WARC-Date": warc_date, IDENTITY_HEADER: response.identity_id},
            )
            offset = self._handle.tell()
            writer.write_request_response_pair(request, answer)  # the response first, at `offset`
            return Capture(
                capture_id=answer.rec_headers.get_header("WARC-Record-ID"),
                warc_file=self.warc_file,
                offset=offset,
                payload_sha256=digest,
                fetched_at=fetched_at,
                url=url,
                identity_id=response.identity_id,
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Make the file durable and put it in place; later captures are refused."""
        with self._lock:
            self._closed = True
            handle, self._handle = self._handle, None
            if handle is None or self._tmp is None or self.warc_file is None:
                return
            try:
                handle.flush()
                os.fsync(handle.fileno())
            finally:
                handle.close()
            final = self._store.path(self.warc_file)
            # Never over another file: the name is new (random), and link() refuses an existing one.
            try:
                os.link(self._tmp, final)
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links: the random name alone keeps it new
                os.replace(self._tmp, final)
            else:
                self._tmp.unlink()
            _fsync_dir(final.parent)

    def _writer(self, fetched_at: datetime) -> WARCWriter:
        if self._handle is None:
            relative = (Path(EVIDENCE_DIR) / self._source / fetched_at.strftime("%Y-%m-%d")
                        / f"{self._lead_id}-{uuid.uuid4().hex[:16]}{WARC_SUFFIX}")
            folder = self._store.path(relative.as_posix()).parent
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{relative.name}.", suffix=".tmp", dir=folder)
            self._handle, self._tmp = os.fdopen(fd, "wb"), Path(tmp_name)
            self.warc_file = relative.as_posix()
            writer = _Sha256Writer(self._handle, gzip=True, warc_version="1.1")
            writer.write_record(writer.create_warcinfo_record(relative.name, {
                "software": SOFTWARE, "format": "WARC File Format 1.1", "source": self._source,
                "lead-id": self._lead_id,
            }))
            self._warc = writer
        assert self._warc is not None
        return self._warc


@dataclass(frozen=True)
class StoredCapture:
    """A response record as read back from its WARC file."""

    record_id: str
    target_uri: str | None
    payload: bytes
    payload_digest: str | None  # the WARC-Payload-Digest header, as written ("sha256:<base32>")
    # What a reader needs to read the answer again as the fleet did (its adapter's `judge`, `parse`).
    record_type: str | None = None  # "response" for a capture
    status: int | None = None  # the HTTP status of a response
    http_headers: tuple[tuple[str, str], ...] = ()  # as written (redacted; see the module docstring)
    warc_date: str | None = None  # WARC-Date: when it was fetched, "%Y-%m-%dT%H:%M:%S.%fZ"
    offset: int | None = None  # of the record's gzip member in its file

    @property
    def fetched_at(self) -> datetime | None:
        """WARC-Date as an aware UTC datetime (None when the record has none, or not a date)."""
        try:
            return datetime.fromisoformat((self.warc_date or "").replace("Z", "+00:00")).astimezone(UTC)
        except ValueError:
            return None


def read_capture(path: str | os.PathLike[str], offset: int) -> StoredCapture:
    """The WARC record at `offset` of `path` (the response a capture points at). Raises ValueError
    when there is no readable record there."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        try:
            for record in ArchiveIterator(handle):
                return _stored(record, offset)
        except Exception as exc:  # noqa: BLE001 - a damaged file fails in zlib, warcio or the parser alike
            raise ValueError(f"no readable WARC record at offset {offset}: {type(exc).__name__}: {exc}") from exc
    raise ValueError(f"no WARC record at offset {offset}")


def read_responses(path: str | os.PathLike[str]) -> list[StoredCapture]:
    """Every response record of a WARC file, in file order, each with its offset: all the answers
    one collection captured. Raises ValueError when the file is not readable WARC."""
    found = []
    with open(path, "rb") as handle:
        try:
            archive = ArchiveIterator(handle)
            for record in archive:
                if record.rec_type != "response":
                    continue
                stored = _stored(record, None)
                found.append(replace(stored, offset=archive.get_record_offset()))
        except Exception as exc:  # noqa: BLE001 - as in read_capture
            raise ValueError(f"not a readable WARC file: {type(exc).__name__}: {exc}") from exc
    return found


def read_warcinfo(path: str | os.PathLike[str]) -> dict[str, str]:
    """The fields of a WARC file's warcinfo record (`source`, `lead-id`, `software`...); empty when
    its first record is not a warcinfo record. Raises ValueError when the file is not readable WARC."""
    with open(path, "rb") as handle:
        try:
            for record in ArchiveIterator(handle):
                if record.rec_type != "warcinfo":
                    return {}
                text = record.content_stream().read().decode("utf-8", "replace")
                return {name.strip(): value.strip() for name, sep, value in
                        (line.partition(":") for line in text.splitlines()) if sep}
        except Exception as exc:  # noqa: BLE001 - as in read_capture
            raise ValueError(f"not a readable WARC file: {type(exc).__name__}: {exc}") from exc
    return {}


def _stored(record: ArcWarcRecord, offset: int | None) -> StoredCapture:
    http = record.http_headers
    status = None
    if record.rec_type == "response" and http is not None:
        try:
            status = int(http.get_statuscode())
        except (TypeError, ValueError):
            status = None
    return StoredCapture(
        record_id=record.rec_headers.get_header("WARC-Record-ID"),
        target_uri=record.rec_headers.get_header("WARC-Target-URI"),
        payload=record.raw_stream.read(),
        payload_digest=record.rec_headers.get_header("WARC-Payload-Digest"),
        record_type=record.rec_type,
        status=status,
        http_headers=tuple((str(n), str(v)) for n, v in http.headers) if http is not None else (),
        warc_date=record.rec_headers.get_header("WARC-Date"),
        offset=offset,
    )


def sha256_digest_header(hex_digest: str) -> str:
    """The WARC-Payload-Digest a payload with this sha256 carries (warcio's base32 form)."""
    return "sha256:" + base64.b32encode(bytes.fromhex(hex_digest)).decode("ascii")


def digest_header_hex(header: str | None) -> str | None:
    """The sha256 a WARC-Payload-Digest (`sha256:<base32>`) holds, as hex: the same hash as a
    record's `payload_sha256`, written the other way. None when it is not a readable sha256 digest."""
    if not header:
        return None
    algorithm, _, encoded = header.partition(":")
    if algorithm.strip().lower() != "sha256" or not encoded:
        return None
    try:
        raw = base64.b32decode(encoded.strip().upper())
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
