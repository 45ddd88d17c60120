"""A real fleet on loopback: `dagster-daemon` (run queue, sensors), the intake process, the sandbox."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from investigations.demo.fleet import DAGSTER_ENV, stop_all, wait_http
from tests.fakes import FakeSlack

ROOT = Path(__file__).resolve().parents[2]
SMALL_BATCH_SOURCES = ("slow", "quiet")
LEARNED_SOURCE, LEARNED_RECRAWL = "changing", {"min": "10s", "max": "10m", "every": "15s"}
SECRET = "whsec_ZTJlLXRlc3Qtc2VjcmV0LWZvci10aGUtaW50YWtl"
SLACK_TOKEN = "xoxb-e2e-slack-token-value"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Fleet:
    env: dict[str, str]
    sources_path: Path
    intake_url: str
    data_dir: Path
    dagster_home: Path
    logs: Path

    instance: DagsterInstance
    slack: FakeSlack


@pytest.fixture(scope="session")
def fleet(sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Intake and dagster-daemon as subprocesses, pointed at the session's sandbox web."""
    base = tmp_path_factory.mktemp("fleet")
    dagster_home, data_dir, logs = base / "dagster_home", base / "data", base / "logs"
    for folder in (dagster_home, data_dir, logs):
        folder.mkdir()
    shutil.copyfile(ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    # Create Dagster's storage here, before any fleet process starts: processes that create the same
    # SQLite storage at once can leave it with two schema heads.
    instance = DagsterInstance.from_config(str(dagster_home))
    instance.get_runs(limit=1)
    intake_port = free_port()
    # The repo's sources, with small batches for two sources so the priority test can fill the
    # background run slots with many short runs.
    sources = yaml.safe_load((ROOT / "sources.yaml").read_text())
    for entry in sources["sources"]:
        if entry["name"] in SMALL_BATCH_SOURCES:
            entry["batch_max_leads"] = 4
            entry["timeout_s"] = 30  # their answers are slowed down on purpose in the priority test
        if entry["name"] == LEARNED_SOURCE:
            # Its learned cadence in seconds, not hours, so a lead comes round again within a test.
            entry["recrawl"] = LEARNED_RECRAWL
    sources_path = base / "sources.yaml"
    sources_path.write_text(yaml.safe_dump(sources, sort_keys=False))
    slack = FakeSlack()  # the daemon's alert sensor posts to it over loopback
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "INVESTIGATIONS_DATA_DIR": str(data_dir),
        "INVESTIGATIONS_SOURCES": str(sources_path),
        "INVESTIGATIONS_SANDBOX_URL": sandbox.url,
        "INVESTIGATIONS_WEBHOOK_SECRET": SECRET,
        "INVESTIGATIONS_INTAKE_PORT": str(intake_port),
        "INVESTIGATIONS_SLACK_TOKEN": SLACK_TOKEN,
        "INVESTIGATIONS_SLACK_API_URL": slack.url,
        "INVESTIGATIONS_SLACK_CHANNEL": "#fleet-e2e",
        "INVESTIGATIONS_RECURRING_EVERY": "5s",  # the recurring planner's tick (1m by default)
        **DAGSTER_ENV,
    }
    bin_dir = Path(sys.executable).parent
    procs = []
    with open(logs / "intake.log", "wb") as intake_log, open(logs / "daemon.log", "wb") as daemon_log:
        procs.append(_start_logged([str(bin_dir / "investigations"), "intake"], env, intake_log))
        procs.append(_start_logged([str(bin_dir / "dagster-daemon"), "run", "-w", "workspace.yaml"], env, daemon_log))
        try:
            intake_url = f"http://127.0.0.1:{intake_port}"
            wait_http(f"{intake_url}/healthz", timeout_s=30, procs=procs)
            yield Fleet(env=env, sources_path=sources_path, intake_url=intake_url, data_dir=data_dir, dagster_home=dagster_home, logs=logs,
                        instance=instance, slack=slack)
        finally:
            stop_all(procs)
            slack.close()


def _start_logged(cmd: list[str], env: dict[str, str], log) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)


def wait_for(predicate, *, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
