"""Records from a JSON API: a dotted path to the list of items, and fields picked from each item."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urljoin

from pydantic import Field

from investigations.adapters.base import (
    URL_FIELDS,
    ParsedRecord,
    ParseError,
    ParseModel,
    PlannedRequest,
    TemplateAdapter,
    make_record,
    page_base,
    with_param,
)
from investigations.intake.leads import Lead


class PagesSpec(ParseModel):
    """A paged answer: the next page is asked with `param` while the answer's `count_path` (its
    number of pages) says there is one, up to `max_pages` pages per lead."""

    param: str = Field(min_length=1)
    count_path: str = Field(min_length=1)
    first: int = Field(default=0, ge=0)
    max_pages: int = Field(default=1, ge=1, le=20)


class JsonApiParse(ParseModel):
    """Records from a JSON response: a dotted path to the list, and fields picked from each item."""

    records_path: str = ""
    record_key: str | None = None
    # output field -> dotted path inside one item; empty means keep the whole item
    fields: dict[str, str] = Field(default_factory=dict)
    # The answer is one record (a profile, an account), not a list of them.
    one_record: bool = False
    pages: PagesSpec | None = None


_MISSING = object()


class JsonApiAdapter(TemplateAdapter):
    """Parses `{"results": [...]}`-style answers as configured by `JsonApiParse`."""

    parse_model = JsonApiParse

    def parse(self, body: bytes, *, url: str) -> list[ParsedRecord]:
        """Records of a JSON body; ParseError when it is not JSON or the path does not lead to a list."""
        config = self.parse_config(JsonApiParse)
        try:
            document = json.loads(body)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise ParseError(f"source {self.spec.name!r}: body is not valid JSON ({exc})") from None
        items = dig(document, config.records_path) if config.records_path else document
        if config.one_record and isinstance(items, dict):
            items = [items]
        if not isinstance(items, list):
            found = "nothing" if items is _MISSING else f"a {type(items).__name__}"
            where = f"records_path {config.records_path!r}" if config.records_path else "the top level"
            wanted = "an object (one_record)" if config.one_record else "a list of records"
            raise ParseError(f"source {self.spec.name!r}: {where} holds {found}, not {wanted}")
        base = page_base(url)
        records = []
        for item in items:
            if config.fields:
                fields = {name: _none_if_missing(dig(item, path)) for name, path in config.fields.items()}
            else:
                # A list of scalars still makes records; each keeps its value under one name.
                fields = dict(item) if isinstance(item, dict) else {"value": item}
            for name in URL_FIELDS:
                if isinstance(fields.get(name), str) and fields[name]:
                    fields[name] = urljoin(base, fields[name])
            records.append(make_record(fields, page_url=base, raw_key=_key_of(item, fields, config.record_key)))
        return records


    def follow(self, lead: Lead, request: PlannedRequest, body: bytes) -> list[PlannedRequest]:
        """The next page of a paged answer (`parse.pages`), while the answer says there is one."""
        config = self.parse_config(JsonApiParse)
        pages = config.pages
        if pages is None or request.page + 1 >= pages.max_pages:
            return []
        try:
            count = dig(json.loads(body), pages.count_path)
        except ValueError:
            return []  # parse has already said what is wrong with the body
        if not isinstance(count, int) or isinstance(count, bool) or request.page + 1 >= count:
            return []
        url = with_param(request.url, pages.param, str(pages.first + request.page + 1))
        return [PlannedRequest(request.method, url, dict(request.headers), page=request.page + 1)]


def dig(value: Any, path: str) -> Any:
    """The value at a dotted path (`a.b.0.c`; digits index lists), or a sentinel when it is missing."""
    for step in path.split("."):
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return _MISSING
    return value


def _key_of(item: Any, fields: dict[str, Any], record_key: str | None) -> Any:
    """The record_key value: an output field of that name, else that dotted path in the raw item.

    An API's id is often worth keying on without being worth keeping as a field.
    """
    if not record_key:
        return None
    if record_key in fields:
        return fields[record_key]
    return _none_if_missing(dig(item, record_key))


def _none_if_missing(value: Any) -> Any:
    return None if value is _MISSING else value
