"""The run launcher of a fleet on one machine: each run worker is forked from a warm process.

Dagster's default launcher asks the code server to start a run; the code server spawns a fresh
Python for it, which imports Dagster and every library the definitions use before the run's first
step: 1.5-2 s of CPU, 2-3 s of waiting on a busy 2-core machine, paid by every run and first of all
by a fresh lead's, which an investigator waits on. This launcher keeps one template process (Python's
`forkserver`) that has imported those libraries once (PRELOAD) and forks each run worker from it.
The template also imports the fleet's definitions (resources/warm_definitions.py), and a worker keeps
them while nothing they were built from has changed; after a code or sources change a worker imports
them afresh, so the change reaches the next run as it does with the default launcher.

What the worker does is what `dagster api execute_run` does (`resources.dagster_internals.execute_run_here`):
the run's events, its engine events ("Started process for run (pid: N)") and its end are the same.

It also does what the code server did for its children, and a little more:
- a worker that dies without ending its run (kill -9, out of memory) fails the run within a second
  (a watcher thread in the launching process), so run retries and `requeue_dead_runs` take over;
- run monitoring checks a worker by its pid and start time on this host
  (`check_run_worker_health`), so a run whose launching daemon died is still failed when its worker
  does, at the next monitoring pass, instead of at its `dagster/max_runtime`;
- terminating a run (the UI's Terminate, `dagster/max_runtime`) interrupts the worker, as the code
  server would.

It launches on this machine only, and only a run whose code location runs on this machine's Python
(the run's origin names `sys.executable`); any other run goes to the code server as with Dagster's
`DefaultRunLauncher`, which this class extends. A deployment whose daemon and code location sit on
different hosts or images keeps Dagster's own launchers (deploy/dagster.yaml).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any, Self

from dagster import DagsterInstance, DagsterRun, DefaultRunLauncher, deserialize_value, serialize_value

from investigations.scheduling.priority import lower_cpu_priority_if_background
from resources.dagster_internals import (
    CheckRunHealthResult,
    ConfigurableClassData,
    LaunchRunContext,
    WorkerStatus,
    execute_run_here,
)

logger = logging.getLogger(__name__)

# Where a run's worker is, for run monitoring and termination: {"host", "pid", "start"} (its start
# time in clock ticks since boot, so a pid reused by another process is not taken for the worker).
WORKER_TAG = "investigations/run_worker"

# The module that imports the definitions in the template (resources/warm_definitions.py).
WARM_DEFINITIONS = "resources.warm_definitions"

# What the template process imports before it forks: Dagster's run execution and the libraries the
# definitions import (tests/resources/test_run_launcher.py checks the list against them). A module
# missing here is simply imported by each worker, as before.
PRELOAD = (
    "dagster",
    "dagster._cli.api",
    "dagster._core.execution.api",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster_postgres",
    "dagster_slack",
    "resources.dagster_internals",
    "alembic",
    "certifi",
    "httpcore",
    "httpx",
    "numpy",
    "pyarrow",
    "pyarrow.parquet",
    "pydantic",
    "rich",
    "selectolax.lexbor",
    "slack_sdk",
    "sqlalchemy",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.sqlite",
    "standardwebhooks",
    "warcio",
    "yaml",
    # Last: the definitions themselves, imported with all of the above in place.
    WARM_DEFINITIONS,
)

# The project's packages and the code location's module (workspace.yaml), whose files the template's
# warm definitions are built from.
PROJECT_PACKAGES = ("investigations", "assets", "resources", "sensors")
DEFINITIONS_MODULE = "definitions"

# How often the watcher looks again when no worker has ended (a new worker is watched from then on).
WATCH_S = 0.5


def _proc_state(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time in clock ticks since boot (fields 3 and 22 of
    /proc/<pid>/stat), None where it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def code_signature() -> tuple[tuple[str, int, int], ...]:
    """What a template's warm definitions are built from, as a launching process finds it on its own
    path (the template's is the same): every Python file of the project's packages, the definitions
    module and the sources file, each with its size and modification time (about 2 ms)."""
    from investigations.config import Settings

    files: list[str] = []
    for package in PROJECT_PACKAGES:
        spec = importlib.util.find_spec(package)
        for directory in (spec.submodule_search_locations or []) if spec else []:
            for root, dirs, names in os.walk(directory):
                dirs[:] = sorted(name for name in dirs if name != "__pycache__")
                files.extend(os.path.join(root, name) for name in sorted(names) if name.endswith(".py"))
    definitions = importlib.util.find_spec(DEFINITIONS_MODULE)
    if definitions is not None and definitions.origin:
        files.append(definitions.origin)
    files.append(str(Settings.from_env().sources_path))
    return file_stats(files)


def file_stats(paths: Sequence[str]) -> tuple[tuple[str, int, int], ...]:
    """Each file with its size and modification time in ns (-1, -1: none there)."""
    stats = []
    for path in paths:
        try:
            stat = os.stat(path)
            stats.append((path, stat.st_size, stat.st_mtime_ns))
        except OSError:
            stats.append((path, -1, -1))
    return tuple(stats)


def _run_worker(run_id: str, instance_ref: str, code: tuple[str | None, str | None] = (None, None),
                tags: Mapping[str, str] | None = None) -> None:
    """The forked worker: the run, as `dagster api execute_run` runs it, in this process. `code` is
    the run's code location (its module, its working directory): where it is the template's warm
    definitions, and they are current, the run uses them instead of importing its own. A background
    run (by its `tags`) works at its lower CPU priority from its first instruction: starting a run
    (Dagster's run set-up, the step's first events) costs a second or so of CPU, which at the default
    priority a batch's start would take from the batches already collecting (their sends wake late
    and lose their slots) and from a fresh lead's run."""
    lower_cpu_priority_if_background(tags or {})
    if (warm := sys.modules.get(WARM_DEFINITIONS)) is not None:
        warm.reuse_or_forget(*code)
    with DagsterInstance.from_ref(deserialize_value(instance_ref)) as instance:  # type: ignore[arg-type]
        execute_run_here(run_id, instance)


class WarmRunLauncher(DefaultRunLauncher):
    """Forks each run worker of this machine's code location from a process that has imported Dagster
    and the definitions' libraries once (module docstring). Configured in dagster.yaml:

        run_launcher:
          module: resources.run_launcher
          class: WarmRunLauncher
    """

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        super().__init__(inst_data=inst_data)
        self._lock = threading.Lock()
        # Held while a worker is forked: the template is replaced only between two forks.
        self._start_lock = threading.Lock()
        self._context: ForkServerContext | None = None
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._workers: dict[str, multiprocessing.process.BaseProcess] = {}
        self._watcher: threading.Thread | None = None
        self._host = socket.gethostname()

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> Self:
        return cls(inst_data=inst_data)

    # -- launching ---------------------------------------------------------------------------------

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        if origin is None or os.path.realpath(origin.executable_path) != os.path.realpath(sys.executable):
            # Another Python (a container's, another venv's): its code server starts the run.
            super().launch_run(context)
            return
        pointer = origin.repository_origin.code_pointer
        code = (getattr(pointer, "module", None), getattr(pointer, "working_directory", None))
        with self._start_lock:
            worker = self._forkserver().Process(
                target=_run_worker,
                args=(run.run_id, serialize_value(self._instance.get_ref()), code, dict(run.tags)),
                name=f"run-{run.run_id[:8]}",
            )
            worker.start()
        pid = worker.pid
        assert pid is not None
        self._instance.add_run_tags(run.run_id, {
            WORKER_TAG: json.dumps({"host": self._host, "pid": pid,
                                    "start": state[1] if (state := _proc_state(pid)) else None}),
        })
        with self._lock:
            self._workers[run.run_id] = worker
            if self._watcher is None or not self._watcher.is_alive():
                self._watcher = threading.Thread(target=self._watch, name="run-workers", daemon=True)
                self._watcher.start()

    def _forkserver(self) -> ForkServerContext:
        """The template process, started (and its libraries and the definitions imported) at the
        first launch, and again at the first launch after the project's code or its sources file
        changed: a template that kept the old definitions would leave every later run to import
        the new ones itself. Workers forked from the old template run on; run monitoring watches
        them from then on (see `_fail_if_unfinished`)."""
        signature = code_signature()
        with self._lock:
            if self._context is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(list(PRELOAD))
                self._context = context
            elif signature != self._signature:
                logger.info("the project's code or sources file changed: the run launcher starts a new template process")
                # The standard library's own way to stop its fork server (its tests use it); the next
                # fork starts a new one.
                multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
            self._signature = signature
            return self._context

    # -- watching ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Fail the run of every worker that ended without ending its run; forget ended workers."""
        while True:
            with self._lock:
                workers = dict(self._workers)
            if not workers:
                with self._lock:
                    if not self._workers:
                        self._watcher = None
                        return
                continue
            by_sentinel = {worker.sentinel: run_id for run_id, worker in workers.items()}
            for sentinel in multiprocessing.connection.wait(list(by_sentinel), timeout=WATCH_S):
                run_id = by_sentinel[sentinel]  # type: ignore[index]
                worker = workers[run_id]
                worker.join()
                try:
                    self._fail_if_unfinished(run_id, worker.exitcode)
                except Exception:  # noqa: BLE001 - the watcher outlives one storage error
                    logger.exception("could not record the end of run %s's worker", run_id)
                with self._lock:
                    self._workers.pop(run_id, None)
                worker.close()

    def _fail_if_unfinished(self, run_id: str, exitcode: int | None) -> None:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return
        where = _worker_of(run)
        if where is not None and _alive(where):
            # The template process died, not the worker (its exit reads as 255): run monitoring
            # checks the worker itself from now on.
            return
        how = f"was killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exited with code {exitcode}"
        self._instance.report_engine_event(f"The run's worker process {how} before the run ended.", run,
                                           cls=self.__class__)
        self._instance.report_run_failed(run)

    # -- health and termination --------------------------------------------------------------------

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        where = _worker_of(run)
        if where is None:
            # Started by the code server (another Python): Dagster's default launcher cannot tell either.
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not a worker of this launcher")
        if where["host"] != self._host:
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"its worker runs on {where['host']}")
        if _alive(where):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(where["pid"]))
        return CheckRunHealthResult(WorkerStatus.FAILED, f"its worker (pid {where['pid']}) is gone",
                                    run_worker_id=str(where["pid"]))

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        where = _worker_of(run) if run is not None else None
        if run is None or where is None:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        if where["host"] != self._host or not _alive(where):
            self._instance.report_engine_event("The run's worker is not running on this host: nothing to interrupt.",
                                               run, cls=self.__class__)
            return False
        # What the code server does for its children: an interrupt, which the worker turns into
        # the run's cancellation (its steps stop, the run ends CANCELED).
        os.kill(where["pid"], signal.SIGINT)
        return True

    def join(self, timeout: float = 30) -> None:
        """Wait for the workers this launcher started (tests, shutdown)."""
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.join(timeout)
        super().join(timeout)


def _worker_of(run: DagsterRun) -> dict[str, Any] | None:
    raw = run.tags.get(WORKER_TAG)
    if not raw:
        return None
    try:
        where = json.loads(raw)
    except ValueError:
        return None
    return where if isinstance(where, dict) and isinstance(where.get("pid"), int) else None


def _alive(where: Mapping[str, Any]) -> bool:
    """Whether the worker the tag names still runs: its pid, with the same start time, not a zombie."""
    found = _proc_state(where["pid"])
    if found is None:
        return False
    state, started = found
    return state != "Z" and (where.get("start") is None or started == where["start"])
