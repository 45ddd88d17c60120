"""`make run`'s Dagster: its instance and workspace in DAGSTER_HOME, and a start-up that says nothing
misleading."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import yaml
from dagster._core.workspace.load_target import WorkspaceFileTarget

from investigations.demo.fleet import fleet_env, prepare_dagster_home, start_dagster_dev, stop_all

ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dagster_home_gets_the_projects_instance_and_a_workspace_that_loads_from_anywhere(tmp_path: Path) -> None:
    workspace = prepare_dagster_home(ROOT, tmp_path / "home")
    assert (tmp_path / "home" / "dagster.yaml").read_text() == (ROOT / "dagster.yaml").read_text()
    (location,) = yaml.safe_load(workspace.read_text())["load_from"]
    assert location["python_module"]["module_name"] == "definitions"
    assert location["python_module"]["working_directory"] == str(ROOT)
    (origin,) = WorkspaceFileTarget(paths=[str(workspace)]).create_origins()
    assert origin.loadable_target_origin.working_directory == str(ROOT)  # type: ignore[attr-defined]


def test_dagster_dev_starts_without_a_misleading_warning(tmp_path: Path) -> None:
    env = fleet_env(ROOT, {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"),
                           "INVESTIGATIONS_DATA_DIR": str(tmp_path / "data")})
    home = Path(env["DAGSTER_HOME"])
    workspace = prepare_dagster_home(ROOT, home)
    port, log = free_port(), tmp_path / "dev.log"
    with log.open("wb") as out:
        proc = start_dagster_dev(env, port, home, workspace, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    locations = httpx.post(f"http://127.0.0.1:{port}/graphql", timeout=5, json={
                        "query": "{ workspaceOrError { ... on Workspace { locationEntries { name "
                                 "locationOrLoadError { __typename } } } } }"}).json()
                    entries = locations["data"]["workspaceOrError"]["locationEntries"]
                    if entries and entries[0]["locationOrLoadError"]:
                        break
                except (httpx.HTTPError, KeyError, TypeError):
                    pass
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
        finally:
            stop_all([proc])
    said = log.read_text()
    assert entries == [{"name": "investigations", "locationOrLoadError": {"__typename": "RepositoryLocation"}}], said
    assert "dagster.yaml" not in said and "superseded" not in said, said
    # The daemon's lines for each sensor checked, every few seconds, stay out of the console.
    assert not [line for line in said.splitlines() if "dagster.daemon" in line and "INFO" in line], said
