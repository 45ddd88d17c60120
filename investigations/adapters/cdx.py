"""Captures from a CDX server: the Wayback Machine's CDX API and the Common Crawl index.

Both speak pywb's CDX query language. The Wayback Machine answers `output=json` with an array of
rows whose first row names the columns (and, with `showResumeKey`, an empty row and a resume key
after the last capture); Common Crawl answers one JSON object per line. A record is one capture,
keyed by its SURT url key and timestamp, so the same capture is the same record on every crawl.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal
from urllib.parse import quote

from pydantic import Field, PositiveFloat, field_validator

from investigations.adapters.base import (
    TEMPLATE_FIELDS,
    ParsedRecord,
    ParseError,
    ParseModel,
    PlannedRequest,
    TemplateAdapter,
    fill_template,
    make_record,
    page_base,
    with_param,
)
from investigations.intake.leads import Lead


class CdxParse(ParseModel):
    """Captures from a CDX server (Wayback Machine, Common Crawl index), one record per capture.

    `match_type` picks the CDX `matchType` per lead kind (a domain and its subdomains, one exact
    url). With `index_catalog`, `request.url` is the server's collection list (Common Crawl's
    `collinfo.json`, newest first, cached `catalog_ttl_s`) and `query` is asked of its newest index.
    """

    format: Literal["json_rows", "ndjson"] = "json_rows"
    match_type: dict[str, str] = Field(default_factory=lambda: {"domain": "domain", "url": "exact"})
    # output field -> CDX field; empty keeps every field the server sent
    fields: dict[str, str] = Field(default_factory=dict)
    index_catalog: bool = False
    catalog_ttl_s: PositiveFloat = 86400.0
    query: str = ""
    # json_rows with `showResumeKey=true` in the query: further pages asked with the resume key
    # the server puts after the last capture, up to this many pages per lead.
    max_pages: int = Field(default=1, ge=1, le=20)

    @field_validator("query")
    @classmethod
    def _query_template(cls, query: str) -> str:
        unknown = set(re.findall(r"\{([^}]*)\}", query)) - TEMPLATE_FIELDS
        if unknown:
            raise ValueError(f"query uses unknown placeholders {sorted(unknown)}; known: {sorted(TEMPLATE_FIELDS)}")
        return query



class CdxAdapter(TemplateAdapter):
    """Plans a CDX query per lead (its `matchType` by lead kind) and parses its captures."""

    parse_model = CdxParse

    @property
    def config(self) -> CdxParse:
        return self.parse_config(CdxParse)

    def plan(self, lead: Lead) -> list[PlannedRequest]:
        """The query for `lead`; with `index_catalog`, first the collection list unless cached."""
        if not self.config.index_catalog:
            url = self._with_match(fill_template(self.spec.request.url, lead), lead)
            return [PlannedRequest(self.spec.request.method, url, self.headers())]
        index = self.cache.get(f"cdx {self.spec.request.url}", ttl_s=self.config.catalog_ttl_s)
        if index is None:
            return [PlannedRequest("GET", self.spec.request.url, self.headers(), collects=False)]
        return [self._index_query(index, lead)]

    def follow(self, lead: Lead, request: PlannedRequest, body: bytes) -> list[PlannedRequest]:
        """After the collection list: the query to its newest index (which is then cached); after
        a page of captures that ends in a resume key: the next page, up to `parse.max_pages`."""
        if request.collects:
            if self.config.format != "json_rows" or request.page + 1 >= self.config.max_pages:
                return []
            key = resume_key(body)
            if key is None:
                return []
            url = with_param(request.url, "resumeKey", key)
            return [PlannedRequest(request.method, url, dict(request.headers), page=request.page + 1)]
        index = newest_index(body)
        self.cache.put(f"cdx {self.spec.request.url}", index)
        return [self._index_query(index, lead)]

    def parse(self, body: bytes, *, url: str) -> list[ParsedRecord]:
        """One record per capture; ParseError when the body is not the configured format."""
        rows = _json_rows(body) if self.config.format == "json_rows" else _ndjson(body)
        base = page_base(url)
        records = []
        for row in rows:
            fields = ({name: row.get(column) for name, column in self.config.fields.items()}
                      if self.config.fields else row)
            key = f"{row.get('urlkey', '')} {row.get('timestamp', '')}".strip() or None
            records.append(make_record(fields, page_url=base, raw_key=key))
        return records

    def _index_query(self, index: str, lead: Lead) -> PlannedRequest:
        url = f"{index}?{fill_template(self.config.query, lead)}" if self.config.query else index
        url = self._with_match(url, lead)
        return PlannedRequest("GET", url, self.headers_for(url))

    def _with_match(self, url: str, lead: Lead) -> str:
        match = self.config.match_type.get(lead.kind)
        if not match:
            return url
        return f"{url}{'&' if '?' in url else '?'}matchType={quote(match, safe='')}"


def newest_index(body: bytes) -> str:
    """The CDX endpoint of the newest collection in Common Crawl's `collinfo.json`.

    Ids are `CC-MAIN-<year>-<week>`, which sort by time; the list's order is not relied on.
    """
    try:
        collections = json.loads(body)
    except ValueError as exc:
        raise ParseError(f"collection list is not valid JSON ({exc})") from None
    usable = [c for c in collections if isinstance(c, dict) and isinstance(c.get("id"), str)
              and isinstance(c.get("cdx-api"), str) and c["cdx-api"].startswith(("http://", "https://"))] \
        if isinstance(collections, list) else []
    if not usable:
        raise ParseError("collection list names no collection with a cdx-api url")
    return max(usable, key=lambda c: c["id"])["cdx-api"]


def resume_key(body: bytes) -> str | None:
    """The key after the last capture of a `showResumeKey` answer (an empty row, then `[key]`)."""
    try:
        rows = json.loads(body)
    except ValueError:
        return None
    if (isinstance(rows, list) and len(rows) >= 2 and rows[-2] == [] and isinstance(rows[-1], list)
            and len(rows[-1]) == 1 and isinstance(rows[-1][0], str) and rows[-1][0]):
        return rows[-1][0]
    return None


def _json_rows(body: bytes) -> list[dict[str, Any]]:
    try:
        rows = json.loads(body) if body.strip() else []
    except ValueError as exc:
        raise ParseError(f"CDX answer is not valid JSON ({exc})") from None
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        raise ParseError("CDX answer is not an array of rows")
    if not rows:
        return []
    header, captures = rows[0], rows[1:]
    if not all(isinstance(name, str) for name in header):
        raise ParseError("CDX answer's first row is not a header of column names")
    out = []
    for row in captures:
        if not row:
            break  # showResumeKey: an empty row, then the key to ask the next page with
        out.append(dict(zip(header, row, strict=False)))
    return out


def _ndjson(body: bytes) -> list[dict[str, Any]]:
    out = []
    for number, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ParseError(f"CDX line {number} is not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise ParseError(f"CDX line {number} is not an object")
        out.append(row)
    return out
