"""What every adapter shares: the planned request, the parsed record and how a record is keyed.

An adapter turns a lead into requests and a response body into records. It never does I/O: the
fetcher sends, the adapter only plans and parses, so parsing is tested on recorded bodies. An
adapter may also read a source's answers by the source's own rules (`judge`), and plan further
requests from an answer (`follow`: a bootstrap file naming the server to ask).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urljoin, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict

from investigations.adapters.cache import BOOTSTRAPS, TtlCache
from investigations.collection.classify import Answer, Verdict, judge_answer
from investigations.evidence.canonical import canonical_json
from investigations.intake.leads import Lead
from investigations.net.guard import url_origin
from investigations.net.redaction import redact_url

if TYPE_CHECKING:  # specs read the registry of adapters: the dependency runs that way
    from investigations.sources.specs import SourceSpec

# Fields whose value is a link: made absolute against the page and used as the record's url.
URL_FIELDS = ("url", "link")


# The placeholders a url or query template may use (`fill_template`).
TEMPLATE_FIELDS = frozenset({"kind", "value", "lead_id"})


class ParseModel(BaseModel):
    """A source's `parse:` block as one adapter reads it; each adapter's model sits beside it, and
    the sources file picks it by the source's `adapter`."""

    model_config = ConfigDict(extra="forbid", frozen=True)


AnyParse = TypeVar("AnyParse", bound=ParseModel)


class ParseError(Exception):
    """A body that does not have the shape the source's parse config expects."""


@dataclass(frozen=True)
class PlannedRequest:
    """One request an adapter wants sent for a lead; the fetcher sends it."""

    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    # False: the answer holds no records but what to ask next (a bootstrap file, an index list);
    # the adapter's `follow` reads it.
    collects: bool = True
    # Which page of a paged answer this asks for, counted from 0 (`follow` plans the next).
    page: int = 0


@dataclass(frozen=True)
class ParsedRecord:
    """One thing a source said about a lead: a stable key, where it was seen, and its fields."""

    key: str
    url: str | None
    fields: dict[str, Any]


class Adapter(Protocol):
    """Plans the requests for a lead and parses a response body into records."""

    spec: SourceSpec
    # Stored with every record (evidence/records.py), so a record can be traced to the parsing that made it.
    parser_version: str

    def requests_for(self, lead: Lead) -> list[PlannedRequest]: ...

    def parse(self, body: bytes, *, url: str) -> list[ParsedRecord]: ...

    def judge(self, answer: Answer, *, now: datetime) -> Verdict | None: ...

    def follow(self, lead: Lead, request: PlannedRequest, body: bytes) -> list[PlannedRequest]: ...


class TemplateAdapter:
    """Base of the generic adapters: one request per lead, built from the spec's url template.

    `cache` keeps what an adapter learns from bootstrap answers (see `adapters.cache`).
    `parser_version` is raised by an adapter whenever a change makes it read the same answer into
    different records, so stored records say which parsing made them.
    """

    parser_version = "1"
    # The model this adapter's `parse:` block is read into (each adapter sets its own).
    parse_model: ClassVar[type[ParseModel]]

    def __init__(self, spec: SourceSpec, *, cache: TtlCache | None = None) -> None:
        self.spec = spec
        self.cache = cache if cache is not None else BOOTSTRAPS

    def requests_for(self, lead: Lead) -> list[PlannedRequest]:
        """The requests for `lead` (`plan`), or none when the source does not take leads of its kind."""
        if not self.spec.accepts(lead.kind):
            return []
        return self.plan(lead)

    def plan(self, lead: Lead) -> list[PlannedRequest]:
        """The requests for a lead the source takes: one, from the spec's url template."""
        url = fill_template(self.spec.request.url, lead)
        return [PlannedRequest(self.spec.request.method, url, self.headers())]

    def parse_config(self, model: type[AnyParse]) -> AnyParse:
        """The source's `parse:` block as the `model` this adapter reads (the spec chose the model
        by adapter name when the sources file was read, so another one is a programming error)."""
        config = self.spec.parse
        if not isinstance(config, model):
            raise TypeError(f"source {self.spec.name!r} has a {type(config).__name__}, not a {model.__name__}")
        return config

    def headers(self) -> dict[str, str]:
        """The source's request headers, with its bearer token when it has one."""
        headers = dict(self.spec.request.headers)
        if self.spec.request.bearer_token:
            headers["Authorization"] = f"Bearer {self.spec.request.bearer_token}"
        return headers

    def headers_for(self, url: str) -> dict[str, str]:
        """The headers for a planned url: all of them at the source's own origin; elsewhere (a server
        a bootstrap file names) only `Accept`, since the others may carry a key meant for the source."""
        if url_origin(url) == url_origin(self.spec.request.url):
            return self.headers()
        return {k: v for k, v in self.spec.request.headers.items() if k.lower() == "accept"}

    def parse(self, body: bytes, *, url: str) -> list[ParsedRecord]:  # pragma: no cover - abstract
        raise NotImplementedError

    def judge(self, answer: Answer, *, now: datetime) -> Verdict | None:
        """The source's declared rules (`answers:`) on an answer; None leaves the general ones."""
        return judge_answer(self.spec.answers, answer, now=now)

    def follow(self, lead: Lead, request: PlannedRequest, body: bytes) -> list[PlannedRequest]:
        """Requests an answer calls for; a one-request source has none."""
        return []


def with_param(url: str, name: str, value: str) -> str:
    """`url` with the query parameter `name` set to `value` (replaced if there, else appended)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name]
    return urlunsplit(parts._replace(query=urlencode([*query, (name, value)], quote_via=quote)))


def fill_template(template: str, lead: Lead) -> str:
    """A url (or query) template with the lead filled in.

    The value is quoted with safe="" so a lead can never add a path segment or a parameter.
    """
    return template.format_map({"kind": lead.kind, "value": quote(lead.value, safe=""), "lead_id": lead.id})


def make_record(fields: dict[str, Any], *, page_url: str, raw_key: Any) -> ParsedRecord:
    """Key and url a record's fields.

    The key is `raw_key` (the record_key value) when it has one, else a hash of the canonical
    fields, so the same record gets the same key on every crawl. `page_url` must already be redacted.
    """
    if raw_key is None or raw_key == "":
        key = hashlib.sha256(canonical_json(fields, ascii_only=True).encode()).hexdigest()[:16]
    else:
        key = raw_key if isinstance(raw_key, str) else canonical_json(raw_key, ascii_only=True)
    link = next((fields[name] for name in URL_FIELDS if isinstance(fields.get(name), str) and fields[name]), None)
    return ParsedRecord(key=key, url=urljoin(page_url, link) if link else page_url, fields=fields)


def page_base(url: str) -> str:
    # Records are stored and shown; a secret in the request's query string must not end up there.
    return redact_url(url)
