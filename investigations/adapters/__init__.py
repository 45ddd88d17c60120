"""Adapters: how a source's leads become requests and its answers become records.

One registry: `ADAPTERS` maps the name a source gives in `adapter:` to its class, and each class
names its parse model (`parse_model`, defined beside it), which the sources file's `parse:` block is
read into. Adding an adapter is a module here with both, and one entry below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from investigations.adapters.base import Adapter, ParsedRecord, ParseError, PlannedRequest, TemplateAdapter
from investigations.adapters.cache import TtlCache
from investigations.adapters.cdx import CdxAdapter
from investigations.adapters.doh import DohAdapter
from investigations.adapters.html import HtmlAdapter
from investigations.adapters.json_api import JsonApiAdapter
from investigations.adapters.rdap import RdapAdapter

if TYPE_CHECKING:
    from investigations.sources.specs import SourceSpec


ADAPTERS: dict[str, type[TemplateAdapter]] = {
    "json_api": JsonApiAdapter, "html": HtmlAdapter, "cdx": CdxAdapter, "rdap": RdapAdapter, "doh": DohAdapter,
}


def build_adapter(spec: SourceSpec, *, cache: TtlCache | None = None) -> Adapter:
    """The adapter named by `spec.adapter`, configured by the spec; `cache` keeps what it learns
    from bootstrap answers (the process's own cache when not given)."""
    try:
        make = ADAPTERS[spec.adapter]
    except KeyError:
        raise KeyError(f"source {spec.name!r}: unknown adapter {spec.adapter!r} (known: {', '.join(ADAPTERS)})") from None
    return make(spec, cache=cache)


__all__ = [
    "ADAPTERS",
    "Adapter",
    "ParseError",
    "ParsedRecord",
    "PlannedRequest",
    "TtlCache",
    "build_adapter",
]
