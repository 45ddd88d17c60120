"""Records from an HTML page: one node per record, and `css`, `css@attr` or `@attr` per field."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin

from pydantic import Field
from selectolax.lexbor import LexborHTMLParser, LexborNode, SelectolaxError

from investigations.adapters.base import (
    URL_FIELDS,
    ParsedRecord,
    ParseError,
    ParseModel,
    TemplateAdapter,
    make_record,
    page_base,
)

# Only a name-like tail after the last "@" is an attribute; `a[href*="@"]` stays a selector.
_ATTR_TAIL = re.compile(r"^(?P<css>.*)@(?P<attr>[A-Za-z_:][-\w:.]*)$", re.DOTALL)


class HtmlParse(ParseModel):
    """Records from an HTML page: one CSS selector per record, then `css` or `css@attr` per field."""

    records_selector: str = Field(min_length=1)
    record_key: str | None = None
    fields: dict[str, str] = Field(min_length=1)



class HtmlAdapter(TemplateAdapter):
    """Parses profile-style pages as configured by `HtmlParse`."""

    parse_model = HtmlParse

    def parse(self, body: bytes, *, url: str) -> list[ParsedRecord]:
        """Records of an HTML page; ParseError when a configured selector is not valid CSS."""
        config = self.parse_config(HtmlParse)
        fields_spec = {name: _split(spec) for name, spec in config.fields.items()}
        base = page_base(url)
        tree = LexborHTMLParser(body)
        records = []
        for node in self._select(tree, config.records_selector, key="records_selector"):
            fields = {
                name: self._field(node, name, css, attr, base) for name, (css, attr) in fields_spec.items()
            }
            raw_key = fields.get(config.record_key) if config.record_key else None
            records.append(make_record(fields, page_url=base, raw_key=raw_key))
        return records

    def _field(self, node: LexborNode, name: str, css: str, attr: str | None, base: str) -> Any:
        target = node if not css else self._first(node, css, key=f"fields.{name}")
        if target is None:
            return None
        if attr is None:
            return " ".join(target.text(deep=True).split())
        value = target.attributes.get(attr.lower())  # the parser lower-cases attribute names
        if value is None:
            return None
        value = value.strip()
        if value and (attr.lower() == "href" or name in URL_FIELDS):
            value = urljoin(base, value)
        return value

    def _select(self, tree: LexborHTMLParser, css: str, *, key: str) -> list[LexborNode]:
        try:
            return tree.css(css)
        except SelectolaxError as exc:
            raise ParseError(f"source {self.spec.name!r}: parse.{key}: {css!r} is not a valid CSS selector ({exc})") from None

    def _first(self, node: LexborNode, css: str, *, key: str) -> LexborNode | None:
        try:
            return node.css_first(css)
        except SelectolaxError as exc:
            raise ParseError(f"source {self.spec.name!r}: parse.{key}: {css!r} is not a valid CSS selector ({exc})") from None


def _split(spec: str) -> tuple[str, str | None]:
    """`"a.title@href"` -> ("a.title", "href"); `"@data-id"` -> ("", "data-id"); `"p"` -> ("p", None)."""
    match = _ATTR_TAIL.match(spec.strip())
    if match:
        return match["css"].strip(), match["attr"]
    return spec.strip(), None
