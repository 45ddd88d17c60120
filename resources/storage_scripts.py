"""Dagster's migration scripts, read once per process instead of at every instance opened.

Dagster opens a new `DagsterInstance` for every sensor tick the code server evaluates (the tick's
context builds one from its instance ref as soon as the sensor uses a resource, a logger or the
instance), and each opening checks the schema revision of every SQL storage. That check asks
alembic for the head revision of the storage's migration scripts, and alembic answers by loading
each script file (about 90 Python files per storage) every time. Profiled on the product bench, that
was over half the code server's CPU: about 35 ms per tick on SQLite, two ticks a second.

The scripts are part of the installed Dagster: they cannot change while the process runs. So the
first `ScriptDirectory` alembic builds for one of Dagster's script locations is kept and handed out
again; its revision map is built once. Only Dagster's own locations are kept; any other alembic use
in the process is left as it was. The database's own revision is still read at every opening, so an
instance whose database is behind the scripts is still refused as before.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import dagster
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import coerce_resource_to_filename

DAGSTER_DIR = Path(dagster.__file__).resolve().parent
_lock = threading.Lock()
_scripts: dict[str, ScriptDirectory] = {}
_original: Any = None


def read_migration_scripts_once() -> None:
    """Keep the script directory of each of Dagster's storages for the life of the process (idempotent)."""
    global _original
    with _lock:
        if _original is not None:
            return
        _original = ScriptDirectory.__dict__["from_config"]
        # A deliberate patch of alembic's classmethod: mypy refuses assigning to a method (method-assign),
        # and sees a `classmethod` object where the attribute is declared a callable (assignment).
        ScriptDirectory.from_config = classmethod(_from_config)  # type: ignore[method-assign, assignment]


def _from_config(cls: type[ScriptDirectory], config: Config) -> ScriptDirectory:
    location = config.get_alembic_option("script_location")
    build = _original.__get__(None, cls)
    # Dagster names its locations as package resources ("dagster:_core/storage/alembic").
    if not location or not Path(coerce_resource_to_filename(location)).resolve().is_relative_to(DAGSTER_DIR):
        return build(config)
    with _lock:
        script = _scripts.get(location)
        if script is None:
            script = build(config)
            script.get_heads()  # the revision map is built here, under the lock, not by two threads at once
            _scripts[location] = script
        return script
