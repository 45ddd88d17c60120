"""Adapters: how a source's leads become requests and its answers become records.

Adding an adapter is a class here plus one registry entry; its parse config model lives in
`investigations.specs.PARSE_MODELS` under the same name.
"""

from __future__ import annotations

from collections.abc import Callable

from investigations.adapters.base import Adapter, ParsedRecord, ParseError, PlannedRequest
from investigations.adapters.cache import TtlCache
from investigations.adapters.cdx import CdxAdapter
from investigations.adapters.doh import DohAdapter
from investigations.adapters.html import HtmlAdapter
from investigations.adapters.json_api import JsonApiAdapter
from investigations.adapters.rdap import RdapAdapter
from investigations.specs import SourceSpec

ADAPTERS: dict[str, Callable[..., Adapter]] = {
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
    "CdxAdapter",
    "DohAdapter",
    "HtmlAdapter",
    "JsonApiAdapter",
    "ParseError",
    "ParsedRecord",
    "PlannedRequest",
    "RdapAdapter",
    "TtlCache",
    "build_adapter",
]
