"""The fleet's source catalog, loaded once per process from the configured sources file."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from investigations.sources.specs import SourceCatalog, load_sources


@lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int, env: frozenset[tuple[str, str]]) -> SourceCatalog:
    return load_sources(path, env=dict(env))


def load_catalog(path: str | Path) -> SourceCatalog:
    """Load the sources file at `path`, cached until the file or the environment changes.

    The environment is part of the key because the file may say `${VAR}`.
    """
    path = Path(path).resolve()
    try:
        mtime_ns = path.stat().st_mtime_ns
    except OSError:
        mtime_ns = -1  # let load_sources raise its own clear error
    return _load(str(path), mtime_ns, frozenset(os.environ.items()))
