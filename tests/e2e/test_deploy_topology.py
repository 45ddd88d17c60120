"""The deployment's topology as processes on loopback: one signed case from the intake to stored records.

What deploy/docker-compose.yml and deploy/helm/ run as services, started here as processes of their
own: `dagster code-server start` (the code location, serving gRPC and running the runs),
`dagster-webserver` and `dagster-daemon` on deploy/workspace.yaml (so they load the project from that
code server, not from one of their own), and `investigations intake`. Dagster's storage and the
fleet's state are two fresh PostgreSQL databases, and the Dagster instance is deploy/dagster.yaml
itself, pointed at its database through the environment variables it names.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from dagster import AssetCheckKey, DagsterInstance, DagsterRunStatus, RunsFilter
from sqlalchemy.engine import make_url

from assets.naming import EMPTY_CHECK_NAME, source_asset_key
from bench.common import pg_admin
from investigations.demo.case import send_case
from investigations.demo.fleet import DAGSTER_ENV, stop_all, wait_http
from investigations.evidence.records import RecordStore
from investigations.intake.leads import normalize_lead
from investigations.scheduling.priority import CASE_TAG
from investigations.store import StateStore
from resources.dagster_internals import AssetCheckExecutionRecordStatus
from tests.conftest import POSTGRES_URL, require_postgres
from tests.e2e.conftest import SECRET, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
LOCATION = "investigations"
SOURCE = "robust"
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
LOCATION_STATUS = """
{ workspaceOrError { __typename ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""


@dataclass
class Topology:
    env: dict[str, str]
    instance: DagsterInstance
    state_url: str
    data_dir: Path
    intake_url: str
    webserver_url: str
    code_server_port: int
    logs: Path


def _start(name: str, cmd: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    with open(logs / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)


def _tails(logs: Path, lines: int = 25) -> str:
    """The last lines of every process's log, for a failure's message."""
    parts = []
    for log in sorted(logs.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def _listening(port: int, procs: list[subprocess.Popen[bytes]]) -> bool:
    for proc in procs:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}")
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _graphql(url: str, query: str) -> dict:
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        answer = client.post(f"{url}/graphql", json={"query": query})
    answer.raise_for_status()
    return answer.json()["data"]


def _location_loaded(url: str) -> bool:
    """Whether the webserver loaded the project from the code server. A code server it could not
    reach yet is waited for (the webserver connects again by itself); any other error fails at once."""
    (entry,) = _graphql(url, LOCATION_STATUS)["workspaceOrError"]["locationEntries"]
    loaded = entry["locationOrLoadError"]
    if loaded is not None and loaded["__typename"] == "PythonError":
        if "DagsterUserCodeUnreachableError" in loaded["message"]:
            return False
        raise AssertionError(f"the code location did not load: {loaded['message'][:2000]}")
    return entry["loadStatus"] == "LOADED" and loaded is not None


@pytest.fixture
def topology(sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Topology]:
    require_postgres()
    stamp = uuid.uuid4().hex[:10]
    dagster_db, state_db = f"deploy_e2e_{stamp}", f"deploy_e2e_{stamp}_state"
    server = make_url(POSTGRES_URL)
    dagster_home, data_dir, logs = tmp_path / "dagster_home", tmp_path / "data", tmp_path / "logs"
    for folder in (dagster_home, data_dir, logs):
        folder.mkdir()
    shutil.copyfile(ROOT / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
    state_url = server.set(drivername="postgresql", database=state_db).render_as_string(hide_password=False)
    code_server_port, webserver_port, intake_port = free_port(), free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("INVESTIGATIONS_", "DAGSTER_"))},
        **DAGSTER_ENV,
        "DAGSTER_HOME": str(dagster_home),
        # The variables deploy/dagster.yaml takes Dagster's storage from.
        "DAGSTER_PG_USERNAME": server.username or "postgres",
        "DAGSTER_PG_PASSWORD": server.password or "",
        "DAGSTER_PG_HOST": server.host or "127.0.0.1",
        "DAGSTER_PG_PORT": str(server.port or 5432),
        "DAGSTER_PG_DB": dagster_db,
        # The ones deploy/workspace.yaml names the code server with.
        "INVESTIGATIONS_CODE_SERVER_HOST": "127.0.0.1",
        "INVESTIGATIONS_CODE_SERVER_PORT": str(code_server_port),
        "INVESTIGATIONS_DATABASE_URL": state_url,
        "INVESTIGATIONS_DATA_DIR": str(data_dir),
        "INVESTIGATIONS_SOURCES": str(ROOT / "sources.yaml"),
        "INVESTIGATIONS_SANDBOX_URL": sandbox.url,
        "INVESTIGATIONS_WEBHOOK_SECRET": SECRET,
    }
    bin_dir = Path(sys.executable).parent
    procs: list[subprocess.Popen[bytes]] = []
    instance = None
    created: list[str] = []
    try:
        for db in (dagster_db, state_db):
            pg_admin(f'CREATE DATABASE "{db}"', server=POSTGRES_URL)
            created.append(db)
        # This process reads Dagster's storage through the same file and variables. Its tables are
        # created here, before any process starts, so no two of them create them at once.
        for name in ("DAGSTER_PG_USERNAME", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_DB"):
            monkeypatch.setenv(name, env[name])
        instance = DagsterInstance.from_config(str(dagster_home))
        instance.get_runs(limit=1)
        procs.append(_start("code-server", [str(bin_dir / "dagster"), "code-server", "start", "-m", "definitions",
                                            "-h", "127.0.0.1", "-p", str(code_server_port),
                                            "--location-name", LOCATION], env, logs))
        # The code server listens once it has loaded the project (or failed to); the webserver
        # starts then, so that it finds the location at its first look.
        wait_for(lambda: _listening(code_server_port, procs), timeout_s=60, what="the code server to listen")
        procs.append(_start("webserver", [str(bin_dir / "dagster-webserver"), "-h", "127.0.0.1",
                                          "-p", str(webserver_port), "-w", "deploy/workspace.yaml"], env, logs))
        procs.append(_start("intake", [str(bin_dir / "investigations"), "intake", "--host", "127.0.0.1",
                                       "--port", str(intake_port)], env, logs))
        webserver_url, intake_url = f"http://127.0.0.1:{webserver_port}", f"http://127.0.0.1:{intake_port}"
        wait_http(f"{webserver_url}/server_info", timeout_s=60, procs=procs)
        wait_http(f"{intake_url}/healthz", timeout_s=30, procs=procs)
        wait_for(lambda: _location_loaded(webserver_url), timeout_s=60, what="the webserver to load the code location")
        # The daemon last: its workspace is loaded at start and refreshed only every 60 s.
        procs.append(_start("daemon", [str(bin_dir / "dagster-daemon"), "run", "-w", "deploy/workspace.yaml"],
                            env, logs))
        yield Topology(env=env, instance=instance, state_url=state_url, data_dir=data_dir, intake_url=intake_url,
                       webserver_url=webserver_url, code_server_port=code_server_port, logs=logs)
    except BaseException as exc:
        exc.add_note(_tails(logs))
        raise
    finally:
        stop_all(procs)
        if instance is not None:
            instance.dispose()
        for db in created:
            pg_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)', server=POSTGRES_URL)


def test_a_signed_case_crosses_the_deployed_services_into_records_and_dagsters_storage(topology: Topology) -> None:
    lead = normalize_lead("domain", "deployed-topology.example")
    case_id = f"case-deploy-{uuid.uuid4().hex[:8]}"
    answer = send_case(topology.intake_url, SECRET, {"case_id": case_id, "leads": [lead.as_dict()],
                                                      "sources": [SOURCE]}, webhook_id=f"msg_{case_id}")
    assert answer.status_code == 202, answer.text

    instance = topology.instance
    case_runs = RunsFilter(tags={CASE_TAG: case_id, "investigations/source": SOURCE})
    try:
        (run,) = wait_for(lambda: (rs := instance.get_runs(case_runs)) and all(r.status in FINISHED for r in rs) and rs,
                          timeout_s=60, what="the case's finished run")
    except AssertionError as exc:
        exc.add_note(_tails(topology.logs))
        raise
    assert run.status == DagsterRunStatus.SUCCESS, _tails(topology.logs)
    # The run came from the code location the daemon reached over gRPC, at the workspace's address.
    origin = run.remote_job_origin.repository_origin.code_location_origin
    assert (origin.location_name, origin.port) == (LOCATION, topology.code_server_port)

    # Dagster's storage (the database deploy/dagster.yaml was pointed at): the lead's partition was
    # materialized and its check passed.
    key = source_asset_key(SOURCE)
    assert lead.partition_key in instance.get_materialized_partitions(key)
    checks = instance.event_log_storage.get_asset_check_partition_info([AssetCheckKey(key, EMPTY_CHECK_NAME)])
    passed = {info.partition_key for info in checks
              if info.is_current and info.latest_execution_status == AssetCheckExecutionRecordStatus.SUCCEEDED}
    assert lead.partition_key in passed

    # The fleet's state (the other database) has the lead and its collection; the records are stored.
    store = StateStore.from_url(topology.state_url)
    try:
        assert store.get_lead(lead.id) is not None
        assert set(store.case_lead_ids(case_id) or ()) == {lead.id}
    finally:
        store.close()
    table = RecordStore(topology.data_dir / "records").read(SOURCE, lead.id)
    assert table is not None and table.num_rows >= 1

    # The webserver answers on its port, from the same storage.
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        info = client.get(f"{topology.webserver_url}/server_info")
    assert info.status_code == 200 and "dagster_webserver_version" in info.json()
    status = _graphql(topology.webserver_url, f'{{ runOrError(runId: "{run.run_id}") {{ ... on Run {{ status }} }} }}')
    assert status["runOrError"]["status"] == "SUCCESS"
