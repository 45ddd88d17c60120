"""The warm run launcher (resources/run_launcher.py): run workers forked from a template process that
imported Dagster and the definitions' libraries once, on a real SQLite instance configured as the
fleet's dagster.yaml configures it; a worker that dies fails its run; run monitoring can tell a live
worker from a gone one; terminating a run cancels it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, JobDefinition, reconstructable
from dagster._core.errors import DagsterInvariantViolationError

from investigations.scheduling.priority import BACKGROUND_NICENESS, PriorityClass, run_tags
from resources.dagster_internals import WorkerStatus
from resources.run_launcher import PRELOAD, WARM_DEFINITIONS, WORKER_TAG, WarmRunLauncher
from tests.resources import launcher_jobs

ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = {"investigations", "assets", "resources", "sensors", "definitions", "tests"}


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[DagsterInstance]:
    fleet_settings = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"run_launcher": fleet_settings["run_launcher"], "telemetry": {"enabled": False}}))
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        yield instance
        instance.run_launcher.join(timeout=30)


def _launch(instance: DagsterInstance, job: JobDefinition, *, executable: str | None = None,
            tags: dict[str, str] | None = None) -> DagsterRun:
    origin = reconstructable(job).get_python_origin()
    if executable is not None:
        origin = origin._replace(repository_origin=origin.repository_origin._replace(executable_path=executable))
    run = instance.create_run_for_job(job_def=job, job_code_origin=origin, tags=tags)
    return instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]


def _wait(instance: DagsterInstance, run_id: str, statuses: set[DagsterRunStatus], timeout_s: float = 60) -> DagsterRun:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        if run.status in statuses:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} still {run.status} after {timeout_s} s, not in {statuses}")


def _worker(run: DagsterRun) -> dict:
    return json.loads(run.tags[WORKER_TAG])


def _messages(instance: DagsterInstance, run_id: str) -> list[str]:
    return [entry.message or "" for entry in instance.all_logs(run_id)]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_fleet_launches_its_runs_with_the_warm_launcher(instance: DagsterInstance) -> None:
    assert isinstance(instance.run_launcher, WarmRunLauncher)


def test_a_run_is_executed_by_a_worker_forked_from_the_template_process(instance: DagsterInstance) -> None:
    run = _launch(instance, launcher_jobs.quick)
    ended = _wait(instance, run.run_id, {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE})
    assert ended.status is DagsterRunStatus.SUCCESS
    worker = _worker(ended)
    messages = _messages(instance, run.run_id)
    # The worker announces itself as `dagster api execute_run` does: the pid the tag names.
    assert f"Started process for run (pid: {worker['pid']})." in messages
    logged = next(m for m in messages if m.startswith("worker pid"))
    pid, parent = map(int, re.findall(r"\d+", logged))
    assert pid == worker["pid"]
    # Its parent is the template process, not the launching process.
    assert parent != os.getpid()
    assert "forkserver" in Path(f"/proc/{parent}/cmdline").read_bytes().decode(errors="replace")
    assert _parent(parent) == os.getpid()
    # The template imported the fleet's definitions before it forked (resources/warm_definitions.py).
    assert "template imported the definitions: True" in messages


@pytest.mark.parametrize(("tags", "niceness"), [
    (run_tags(PriorityClass.BACKFILL), BACKGROUND_NICENESS),
    (run_tags(PriorityClass.RECURRING), BACKGROUND_NICENESS),
    ({"dagster/backfill": "abc"}, BACKGROUND_NICENESS),  # a backfill launched from the UI
    (run_tags(PriorityClass.INTERACTIVE), 0),
])
def test_a_background_run_works_at_a_lower_cpu_priority_from_its_start(
    instance: DagsterInstance, tags: dict[str, str], niceness: int
) -> None:
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # the test's own process, and so the template, at 0
    run = _launch(instance, launcher_jobs.quick, tags=tags)
    assert _wait(instance, run.run_id, {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE}).status is DagsterRunStatus.SUCCESS
    # Logged by the run's first op, before anything of ours lowered it (launcher_jobs is not an asset).
    assert f"worker niceness {niceness}" in _messages(instance, run.run_id)


def _template_of(instance: DagsterInstance, job: JobDefinition) -> int:
    """The pid of the template process that forked the worker of a run of `job`."""
    run = _launch(instance, job)
    assert _wait(instance, run.run_id, {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE}).status is DagsterRunStatus.SUCCESS
    logged = next(m for m in _messages(instance, run.run_id) if m.startswith("worker pid"))
    return int(re.findall(r"\d+", logged)[1])


def test_a_changed_sources_file_gets_a_new_template_at_the_next_launch(
    instance: DagsterInstance, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The template's definitions were built from the sources file: once it changes, a template that
    # kept them would leave every later run to import the definitions itself.
    sources = tmp_path / "sources.yaml"
    shutil.copy(ROOT / "sources.yaml", sources)
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(sources))
    first = _template_of(instance, launcher_jobs.quick)
    assert _template_of(instance, launcher_jobs.quick) == first  # nothing changed: the same template
    os.utime(sources, ns=(time.time_ns(), sources.stat().st_mtime_ns + 1_000_000_000))
    assert _template_of(instance, launcher_jobs.quick) != first
    assert not Path(f"/proc/{first}").exists()  # the old template was stopped, not left behind


def test_a_killed_worker_fails_its_run_within_seconds(instance: DagsterInstance) -> None:
    run = _launch(instance, launcher_jobs.slow)
    started = _wait(instance, run.run_id, {DagsterRunStatus.STARTED})
    killed_at = time.monotonic()
    os.kill(_worker(started)["pid"], signal.SIGKILL)
    ended = _wait(instance, run.run_id, {DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS}, timeout_s=10)
    assert ended.status is DagsterRunStatus.FAILURE
    assert time.monotonic() - killed_at < 5
    messages = _messages(instance, run.run_id)
    assert any(m.endswith("The run's worker process was killed by signal 9 before the run ended.") for m in messages)


def test_terminating_a_run_cancels_it(instance: DagsterInstance) -> None:
    run = _launch(instance, launcher_jobs.slow)
    _wait(instance, run.run_id, {DagsterRunStatus.STARTED})
    # The worker takes a moment to reach its step; an interrupt before that cancels it just the same.
    assert instance.run_launcher.terminate(run.run_id)
    ended = _wait(instance, run.run_id, {DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE, DagsterRunStatus.SUCCESS})
    assert ended.status is DagsterRunStatus.CANCELED


def test_run_monitoring_tells_a_live_worker_from_a_gone_one(instance: DagsterInstance) -> None:
    launcher = instance.run_launcher
    assert launcher.supports_check_run_worker_health
    run = _launch(instance, launcher_jobs.slow)
    started = _wait(instance, run.run_id, {DagsterRunStatus.STARTED})
    worker = _worker(started)
    assert launcher.check_run_worker_health(started).status is WorkerStatus.RUNNING
    # Another process that got the same pid later is not the worker: its start time differs.
    reused = started.with_tags({**started.tags, WORKER_TAG: json.dumps({**worker, "start": worker["start"] + 1})})
    assert launcher.check_run_worker_health(reused).status is WorkerStatus.FAILED
    # A worker on another host cannot be checked from here: it is not declared dead.
    elsewhere = started.with_tags({**started.tags, WORKER_TAG: json.dumps({**worker, "host": "another-host"})})
    assert launcher.check_run_worker_health(elsewhere).status is WorkerStatus.RUNNING
    os.kill(worker["pid"], signal.SIGKILL)
    _wait(instance, run.run_id, {DagsterRunStatus.FAILURE}, timeout_s=10)
    assert launcher.check_run_worker_health(started).status is WorkerStatus.FAILED


def test_a_run_of_another_python_goes_to_its_code_server(instance: DagsterInstance) -> None:
    # Dagster's default launcher takes it, and it needs the workspace's code server to start it.
    with pytest.raises(DagsterInvariantViolationError, match="requires a workspace"):
        _launch(instance, launcher_jobs.quick, executable="/opt/another/python")


def test_the_template_process_preloads_every_library_the_definitions_import() -> None:
    # In a fresh Python: after PRELOAD's libraries, importing the definitions adds no library outside the
    # project and the standard library (a library missing from PRELOAD would be imported by every run;
    # a submodule of a preloaded one may still be).
    script = (
        "import importlib, json, sys\n"
        f"for name in {[name for name in PRELOAD if name != WARM_DEFINITIONS]!r}:\n"
        "    importlib.import_module(name)\n"
        "before = {m.split('.')[0] for m in sys.modules}\n"
        "import definitions\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    added = set(json.loads(out.stdout.strip().splitlines()[-1]))
    libraries = {name for name in added - PROJECT_PACKAGES - {"__mp_main__"}
                 if name not in sys.stdlib_module_names and not name.startswith("_")}
    assert libraries == set()
