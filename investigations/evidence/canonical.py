"""One canonical JSON text for values the fleet hashes or compares: equal values, equal text."""

from __future__ import annotations

import json
from typing import Any


def canonical_json(value: Any, *, ascii_only: bool = False) -> str:
    """JSON with sorted keys and no spaces; values JSON cannot hold are written as their `str`.

    Text that is stored or hashed as content (a record's fields, a file's content hash) keeps its
    characters as they are. Record keys made from fields hash the ASCII-escaped text
    (`ascii_only`): keys already stored were made that way, and a record keeps its key from crawl
    to crawl, so that form must not change.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, default=str)
