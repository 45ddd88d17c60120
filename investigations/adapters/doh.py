"""DNS over HTTPS, JSON flavour (Google's `/resolve`, Cloudflare's `/dns-query` with
`accept: application/dns-json`): one question per record type, answers as records.

The answer's `Status` is the DNS RCODE, inside an HTTP 200: NXDOMAIN (3) is the name not
existing, an empty result, and no other type is asked; SERVFAIL (2) is the resolver or the
domain's servers failing, worth another try; the other codes are permanent.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, field_validator

from investigations.adapters.base import (
    ParsedRecord,
    ParseError,
    ParseModel,
    PlannedRequest,
    TemplateAdapter,
    fill_template,
    make_record,
    page_base,
)
from investigations.collection.classify import Answer, Verdict
from investigations.collection.events import Outcome
from investigations.intake.leads import Lead

RR_TYPES: dict[str, int] = {
    "A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28, "SRV": 33,
    "DS": 43, "DNSKEY": 48, "HTTPS": 65, "CAA": 257,
}
_TYPE_NAMES = {number: name for name, number in RR_TYPES.items()}
RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3

class DohParse(ParseModel):
    """DNS over HTTPS, JSON flavour: one question per record type, asked in order."""

    types: tuple[str, ...] = Field(default=("A", "AAAA", "MX", "NS", "TXT"), min_length=1)

    @field_validator("types")
    @classmethod
    def _types(cls, types: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in types if t.upper() not in RR_TYPES]
        if unknown:
            raise ValueError(f"unknown record types {unknown} (known: {', '.join(RR_TYPES)})")
        return tuple(t.upper() for t in types)



class DohAdapter(TemplateAdapter):
    """Asks `parse.types` in order, one request each; stops at NXDOMAIN."""

    parse_model = DohParse

    @property
    def config(self) -> DohParse:
        return self.parse_config(DohParse)

    def plan(self, lead: Lead) -> list[PlannedRequest]:
        """The question for the first record type; the others follow its answer."""
        return [self._question(lead, self.config.types[0])]

    def follow(self, lead: Lead, request: PlannedRequest, body: bytes) -> list[PlannedRequest]:
        """The next type's question (an NXDOMAIN answer is empty, and empty answers are not followed)."""
        asked = (parse_qs(urlsplit(request.url).query).get("type") or [""])[-1]
        types = self.config.types
        position = types.index(asked) if asked in types else len(types)
        return [self._question(lead, types[position + 1])] if position + 1 < len(types) else []

    def judge(self, answer: Answer, *, now: datetime) -> Verdict | None:
        """The RCODE inside a 200; other statuses follow the source's declared and general rules."""
        if answer.status != 200:
            return super().judge(answer, now=now)
        try:
            rcode = json.loads(answer.body).get("Status")
        except (ValueError, AttributeError):
            return None  # not the DoH JSON shape: parse says so
        if rcode == NOERROR or not isinstance(rcode, int):
            return None
        name = RCODES.get(rcode, f"RCODE {rcode}")
        if rcode == NXDOMAIN:
            return Verdict(Outcome.OK, empty=True)
        if rcode == SERVFAIL:
            return Verdict(Outcome.TRANSIENT, reason=f"HTTP 200 with DNS {name}")
        return Verdict(Outcome.PERMANENT, reason=f"HTTP 200 with DNS {name}")

    def parse(self, body: bytes, *, url: str) -> list[ParsedRecord]:
        """One record per answer (name, type, data); ParseError when the body is not DoH JSON.

        TTLs are left out: a resolver's cache counts them down, so keeping them would make every
        crawl a change.
        """
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise ParseError(f"source {self.spec.name!r}: DoH answer is not valid JSON ({exc})") from None
        if not isinstance(document, dict) or not isinstance(document.get("Status"), int):
            raise ParseError(f"source {self.spec.name!r}: DoH answer has no Status")
        answers = document.get("Answer") or []
        if not isinstance(answers, list):
            raise ParseError(f"source {self.spec.name!r}: DoH Answer is not a list")
        base = page_base(url)
        records = []
        for item in answers:
            if not isinstance(item, dict):
                raise ParseError(f"source {self.spec.name!r}: DoH Answer holds a {type(item).__name__}")
            fields: dict[str, Any] = {
                "name": str(item.get("name", "")).rstrip(".").lower(),
                "type": _TYPE_NAMES.get(rtype, str(rtype)) if isinstance(rtype := item.get("type"), int)
                else str(rtype),
                "data": item.get("data"),
            }
            key = f"{fields['name']} {fields['type']} {fields['data']}"
            records.append(make_record(fields, page_url=base, raw_key=key))
        return records

    def _question(self, lead: Lead, rr_type: str) -> PlannedRequest:
        url = fill_template(self.spec.request.url, lead)
        return PlannedRequest("GET", f"{url}{'&' if '?' in url else '?'}type={rr_type}", self.headers())
