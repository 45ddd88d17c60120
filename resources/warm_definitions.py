"""The fleet's definitions, imported once by the run launcher's template process and shared by every
run worker forked from it, while they are what a run would import now.

Importing `definitions` in a run worker (the project's modules, the sources file, the `Definitions`
and its repository) cost about a second of CPU per run on a 2-core machine, more than a 300-lead
case's fresh leads spent collecting. The template (resources/run_launcher.py) imports this module
before it forks any worker, so the import happens once per template instead.

A code change must still reach the next run, as it does when each run imports the definitions
itself. So the template records what the definitions were built from: the file and the size and
modification time of every project module it imported, and of the sources file. A worker first
checks them (`reuse_or_forget`): all unchanged, and the run's code location is this very module,
it keeps what the template imported; anything changed, and it forgets every project module the
template imported, so that Dagster imports them afresh for the run (what each run did before).
An import that fails in the template is forgotten the same way: the run meets the error itself,
where Dagster reports it.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
from pathlib import Path

from resources.run_launcher import DEFINITIONS_MODULE as MODULE
from resources.run_launcher import PROJECT_PACKAGES, file_stats

logger = logging.getLogger(__name__)

# (path, size, mtime in ns) of each file the definitions were built from.
Fingerprint = tuple[tuple[str, int, int], ...]

_before: frozenset[str] = frozenset(sys.modules)
_fingerprint: Fingerprint | None = None
_modules: tuple[str, ...] = ()  # the project modules imported for the definitions


def _added_project_modules() -> tuple[str, ...]:
    """The project modules imported since this module was, itself left out."""
    return tuple(name for name in list(sys.modules)
                 if name.split(".", 1)[0] in (*PROJECT_PACKAGES, MODULE) and name not in _before and name != __name__)


def _inputs() -> list[str]:
    """The files the warm definitions were built from: each project module imported for them, and
    the sources file they were built on."""
    from investigations.config import Settings

    files = sorted({file for name in _modules
                    if (file := getattr(sys.modules.get(name), "__file__", None)) is not None})
    return [*files, str(Settings.from_env().sources_path)]


def forget() -> None:
    """Drop every project module the template imported for the definitions, so the run imports them
    afresh."""
    global _fingerprint, _modules
    for name in _modules:
        sys.modules.pop(name, None)
    _fingerprint, _modules = None, ()


def warm() -> bool:
    """Import the definitions and build their repository (once, in the template); False, with
    nothing kept, where that failed."""
    global _fingerprint, _modules
    try:
        module = importlib.import_module(MODULE)
        module.defs.get_repository_def()
    except Exception:  # noqa: BLE001 - the run reports its own import error; the template must live
        logger.warning("the run launcher's template could not import the definitions: each run imports them itself",
                       exc_info=True)
        _modules = _added_project_modules()
        forget()
        return False
    _modules = _added_project_modules()
    _fingerprint = file_stats(_inputs())
    # What was imported lives as long as the template and every worker: out of the full collections
    # (see assets.sources.freeze_startup_objects), and its garbage collected once here, not per worker.
    gc.collect()
    gc.freeze()
    return True


def is_warm() -> bool:
    return _fingerprint is not None


def reuse_or_forget(module_name: str | None, working_directory: str | None) -> bool:
    """In a worker, before the run loads its code: True where the template's definitions are the
    run's (its code location is `definitions` in the directory they were imported from) and nothing
    they were built from has changed; otherwise forget them (`forget`) and return False."""
    if _fingerprint is None:
        return False
    file = getattr(sys.modules.get(MODULE), "__file__", None)
    same_module = (module_name == MODULE and working_directory is not None and file is not None
                   and Path(working_directory, f"{MODULE}.py").resolve() == Path(file).resolve())
    if same_module and file_stats([path for path, _, _ in _fingerprint]) == _fingerprint:
        return True
    forget()
    return False


warm()
