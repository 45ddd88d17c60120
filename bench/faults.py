"""Fault suite: a real fleet on loopback, leads sent by signed webhook, processes killed with SIGKILL.

Per backend (SQLite, Postgres, or both) a fleet is started in temp dirs with free ports: the
sandbox web (its own process), the webhook intake and `dagster-daemon` (run queue, sensors, run
retries and monitoring; the daemon starts the code server, and run workers are the code server's
children). On Postgres a fresh database is created for the fleet's state and another for Dagster's
storage (dagster-postgres), on a Postgres server the suite starts for the purpose and deletes at the end.

`--leads` leads are sent by signed webhook: a share as interactive leads of `robust` (one lead per
webhook and per run), the rest as backfill leads of `slow` (ten per webhook, collected in batches).
While they are collected, processes are killed with SIGKILL:

- `--kills` run workers, in turn in three windows: **launch** (the worker process exists, its
  step has not started), **step** (a request for the run's lead reached the sandbox, nothing
  stored yet; for a batch, before its first lead is stored), **after_write** (the lead's Parquet
  file exists and the run is still going; for a batch, some of its leads stored, others owed);
- the intake right after it answered 202, at least once (one per ten `--kills`): it is restarted and
  the same delivery is sent again with the same `webhook-id`;
- the daemon once (restarted two seconds later), and the code server once (the daemon starts it
  again);
- on Postgres, the database server once, halfway through the sending: the fleet runs on a server of
  the suite's own (`bench/pgserver.py`, a fresh `initdb` on a free port), crashed with `pg_ctl stop
  -m immediate` (every connection cut, no checkpoint), kept down `--pg-outage-s` and started again
  through crash recovery. While it is down the intake cannot store a delivery and the case system's
  redelivery (the sender sends again until it gets a 202) has to bring it in.

`--soak` is the long run (`make soak`): Postgres only, 10,000 leads, the database server crashed and
restarted twice (`--pg-restarts`), the daemon killed three times (`--daemon-kills`), and two more
figures judged: every process reconnects within `RECONNECT_GOAL_S` of Postgres' return (the
intake's `/healthz` answers, a sensor tick starts and succeeds, the run queue launches a run; the
run's start, a new worker process, is reported beside it), and the resident
memory of each long-lived process (daemon, intake) grows by less than `RSS_GOAL` after its warm-up.

Then the suite waits until every accepted collection is settled (collected or dead-lettered) and
reports, per backend: leads lost (accepted, neither collected nor dead-lettered), duplicates (a
Parquet file with a record key twice, a lead's file seen with two different contents), files whose
content differs from an undisturbed pass (the engine alone, afterwards, against the same
deterministic sandbox), runs stuck (STARTING or STARTED at the end), leases still held past their
TTL, time to recover (last kill -> every lead settled), and the evidence that each window was hit:
killed runs whose leads were then collected by another successful run (a Dagster retry, or a new
handover under a new run key). A window without such evidence fails the suite, so it cannot pass
by killing nothing.

    python -m bench.faults [--leads 300] [--kills 12] [--backend sqlite|postgres|both]
    python -m bench.faults --soak [--leads 10000]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import (
    RESULTS_DIR,
    dagster_postgres_storage,
    engine_digest,
    host_load,
    pg_admin,
    pg_url,
    print_table,
    write_results,
)
from bench.fleet_process import BIN, ROOT, free_port
from bench.pgserver import PostgresServer

NAME = "faults"
SECRET = "whsec_ZmF1bHRzLWJlbmNoLXNlY3JldC1mb3ItbG9vcGJhY2stb25seQ=="
INTERACTIVE_SOURCE, BACKFILL_SOURCE = "robust", "slow"
WINDOWS = ("launch", "step", "after_write")
PREFIX = "faults-"
BACKFILL_PER_WEBHOOK = 10
IDENTITIES = ("loop_a", "loop_b", "loop_c")
ROBUST_DELAY_S = (0.5, 1.5)  # the interactive source answers after this long: a step lasts long enough to be hit
SLOW_BATCH_MAX = 25  # small batches of the backfill source: many batch runs to kill mid-way
POLL_S = 0.1
PATIENCE_S = 20.0  # a kill due waits this long for a run in its own window before another window takes it
START_TIMEOUT_S = 120.0
DRAIN_S = 60.0  # after every lead settled, runs still going get this long to end before they count as stuck
RUN_FLIGHT = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")
PID_RE = re.compile(r"Started process for run \(pid: (\d+)\)")
# Soak goals: every process back within this long of Postgres' return; resident memory of a
# long-lived process grows by less than this share from its warm-up to its last sample.
RECONNECT_GOAL_S = 10.0
SETTLE_S = 30.0  # a Postgres crash comes this long after other process faults, a daemon kill after its return
RSS_GOAL = 0.10
RSS_WARMUP_S = 180.0  # a process's memory is judged from this long after it started
RSS_MIN_JUDGED_S = 600.0  # ... and only if it then lived at least this long (a killed daemon may not)
RSS_EVERY_S = 5.0
SOAK = {"backend": "postgres", "leads": 10_000, "kills": 60, "pg_restarts": 2, "daemon_kills": 3}


# -- processes -----------------------------------------------------------------------------------


@dataclass
class Fleet:
    backend: str
    base: Path
    env: dict[str, str]
    dagster_home: Path
    data_dir: Path
    logs: Path
    database_url: str
    sandbox_url: str
    intake_url: str
    databases: list[str] = field(default_factory=list)
    pg: PostgresServer | None = None  # the fleet's own Postgres server (postgres backend)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    retired: list[subprocess.Popen[bytes]] = field(default_factory=list)  # killed ones, reaped at stop

    def start(self, name: str) -> subprocess.Popen[bytes]:
        commands = {
            "sandbox": [sys.executable, "-m", "bench.fleet_process", "sandbox",
                        "--port", self.env["INVESTIGATIONS_SANDBOX_PORT"], "--watch-prefix", PREFIX],
            "intake": [str(BIN / "investigations"), "intake"],
            "daemon": [str(BIN / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")],
        }
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(commands[name], env=self.env, cwd=ROOT, start_new_session=True,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> int:
        """SIGKILL one process of the fleet (not its children), and wait until it is gone."""
        proc = self.procs.pop(name)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        self.retired.append(proc)
        return proc.pid

    def stop(self) -> None:
        from investigations.demo.fleet import stop_all

        stop_all([*self.procs.values(), *self.retired])
        self.procs.clear()
        self.retired.clear()


def _control(fleet: Fleet, source: str, changes: dict[str, Any]) -> None:
    with httpx.Client(trust_env=False, timeout=10) as client:
        client.post(f"{fleet.sandbox_url}/_control/{source}", json=changes).raise_for_status()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def code_servers(fleet: Fleet) -> list[int]:
    daemon = fleet.procs.get("daemon")
    if daemon is None:
        return []
    return [pid for pid in _children(daemon.pid) if "grpc" in _cmdline(pid) or "code-server" in _cmdline(pid)]


# -- configuration -------------------------------------------------------------------------------


def prepare(backend: str, base: Path, *, backfill_leads: int, pg: PostgresServer | None = None) -> Fleet:
    dagster_home, data_dir, logs = base / "dagster_home", base / "data", base / "logs"
    for folder in (dagster_home, data_dir, logs):
        folder.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    databases: list[str] = []
    if backend == "postgres":
        assert pg is not None, "the postgres backend runs on a server of its own"
        stamp = f"{int(time.time())}_{uuid.uuid4().hex[:6]}"
        state_db, dagster_db = f"faults_{stamp}_state", f"faults_{stamp}_dagster"
        for db in (state_db, dagster_db):
            pg_admin(f'CREATE DATABASE "{db}"', server=pg.url)
            databases.append(db)
        config["storage"] = dagster_postgres_storage(dagster_db, server=pg.url)
        database_url = pg_url(state_db, server=pg.url)
    else:
        database_url = f"sqlite:///{data_dir / 'state.db'}"
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    sources = yaml.safe_load((ROOT / "sources.yaml").read_text())
    for entry in sources["sources"]:
        if entry["name"] == BACKFILL_SOURCE:
            entry["batch_max_leads"] = max(5, min(SLOW_BATCH_MAX, backfill_leads // 6 or 5))
            entry["rate"] = {"source_per_s": 4, "source_burst": 4, "identity_per_s": 2, "identity_burst": 2}
    (base / "sources.yaml").write_text(yaml.safe_dump(sources, sort_keys=False))
    (base / "identities.yaml").write_text(yaml.safe_dump({
        "tiers": ["datacenter"],
        "identities": [{"id": name, "range": name, "tier": "datacenter"} for name in IDENTITIES],
    }, sort_keys=False))
    sandbox_port, intake_port = free_port(), free_port()
    from investigations.demo.fleet import DAGSTER_ENV

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("INVESTIGATIONS_", "DAGSTER_"))},
        **DAGSTER_ENV,
        "DAGSTER_HOME": str(dagster_home),
        "INVESTIGATIONS_DATA_DIR": str(data_dir),
        "INVESTIGATIONS_DATABASE_URL": database_url,
        "INVESTIGATIONS_SOURCES": str(base / "sources.yaml"),
        "INVESTIGATIONS_IDENTITIES": str(base / "identities.yaml"),
        "INVESTIGATIONS_SANDBOX_URL": f"http://127.0.0.1:{sandbox_port}",
        "INVESTIGATIONS_SANDBOX_PORT": str(sandbox_port),
        "INVESTIGATIONS_WEBHOOK_SECRET": SECRET,
        "INVESTIGATIONS_INTAKE_PORT": str(intake_port),
    }
    return Fleet(backend=backend, base=base, env=env, dagster_home=dagster_home, data_dir=data_dir, logs=logs,
                 database_url=database_url, sandbox_url=env["INVESTIGATIONS_SANDBOX_URL"],
                 intake_url=f"http://127.0.0.1:{intake_port}", databases=databases, pg=pg)


# -- deliveries -----------------------------------------------------------------------------------


@dataclass
class Delivery:
    webhook_id: str
    body: dict[str, Any]
    source: str
    values: list[str]
    kill_intake_after: bool = False
    status: int | None = None
    accepted: list[str] = field(default_factory=list)
    attempts: int = 0
    redelivery: dict[str, Any] | None = None
    sent_s: float | None = None


def plan_deliveries(backend: str, leads: int, share: float, rng: random.Random, intake_kills: int) -> list[Delivery]:
    interactive, backfill = [], []
    for n in range(leads):
        value = f"{PREFIX}{backend}-{n:05d}.example"
        (interactive if rng.random() < share else backfill).append(value)
    out = [Delivery(f"msg_{uuid.uuid4().hex}", {"case_id": f"case-faults-{backend}",
                                               "leads": [{"kind": "domain", "value": v}],
                                               "sources": [INTERACTIVE_SOURCE], "priority": "interactive"},
                    INTERACTIVE_SOURCE, [v]) for v in interactive]
    for start in range(0, len(backfill), BACKFILL_PER_WEBHOOK):
        chunk = backfill[start:start + BACKFILL_PER_WEBHOOK]
        out.append(Delivery(f"msg_{uuid.uuid4().hex}", {"case_id": f"case-faults-{backend}",
                                                       "leads": [{"kind": "domain", "value": v} for v in chunk],
                                                       "sources": [BACKFILL_SOURCE], "priority": "backfill"},
                            BACKFILL_SOURCE, chunk))
    rng.shuffle(out)
    for k in range(intake_kills):  # spread over the sending, never the very first delivery
        out[min(len(out) - 1, (k + 1) * len(out) // (intake_kills + 1))].kill_intake_after = True
    return out


def _post(fleet: Fleet, delivery: Delivery) -> httpx.Response | None:
    from investigations.demo.case import send_case

    try:
        return send_case(fleet.intake_url, SECRET, delivery.body, webhook_id=delivery.webhook_id)
    except httpx.HTTPError:
        return None


class Sender(threading.Thread):
    """Sends every delivery at a steady pace, as a case system would: a delivery that gets no 2xx is
    sent again with the same webhook-id. After a delivery marked `kill_intake_after` answers 202 the
    intake is killed, restarted, and the delivery sent again (it must answer 202, all duplicates)."""

    def __init__(self, fleet: Fleet, deliveries: list[Delivery], interval_s: float, lock: threading.Lock) -> None:
        super().__init__(daemon=True)
        self.fleet, self.deliveries, self.interval_s, self.lock = fleet, deliveries, interval_s, lock
        self.sent = 0
        self.intake_kills: list[dict[str, Any]] = []
        self.error: str | None = None

    def run(self) -> None:
        from investigations.demo.fleet import wait_http

        try:
            for delivery in self.deliveries:
                while True:
                    delivery.attempts += 1
                    answer = _post(self.fleet, delivery)
                    if answer is not None and answer.status_code == 202:
                        break
                    time.sleep(0.5)
                delivery.status, delivery.sent_s = 202, time.time()
                delivery.accepted = answer.json().get("accepted", [])
                if delivery.kill_intake_after:
                    with self.lock:
                        pid = self.fleet.kill("intake")
                        killed_at = time.time()
                        self.fleet.start("intake")
                    wait_http(f"{self.fleet.intake_url}/healthz", timeout_s=60)
                    again = None
                    while again is None or again.status_code != 202:
                        again = _post(self.fleet, delivery)
                    body = again.json()
                    delivery.redelivery = {"status": again.status_code, "accepted": body.get("accepted", []),
                                           "duplicates": body.get("duplicates", [])}
                    self.intake_kills.append({"at": killed_at, "pid": pid, "webhook_id": delivery.webhook_id,
                                              "leads": len(delivery.values), **delivery.redelivery})
                self.sent += 1
                time.sleep(self.interval_s)
        except Exception as exc:  # reported in the figures, not swallowed
            self.error = f"{type(exc).__name__}: {exc}"


class FileWatch(threading.Thread):
    """Notes every version of every Parquet file (inode, mtime) with its stored content hash."""

    def __init__(self, records_dir: Path) -> None:
        super().__init__(daemon=True)
        self.records_dir = records_dir
        self.versions: dict[str, list[tuple[int, int, str | None]]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        from investigations.evidence.records import RecordStore

        while not self.stopping.wait(0.5):
            for path in self.records_dir.glob("*/*.parquet"):
                try:
                    st = path.stat()
                except OSError:
                    continue
                key = f"{path.parent.name}/{path.stem}"
                seen = self.versions.setdefault(key, [])
                if not seen or seen[-1][:2] != (st.st_ino, st.st_mtime_ns):
                    seen.append((st.st_ino, st.st_mtime_ns, RecordStore.stored_hash(path)))


# -- the run -------------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def started_at(pid: int) -> float | None:
    """When a process started (epoch seconds), from /proc."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class RssSampler(threading.Thread):
    """The resident memory of each long-lived process of the fleet, every RSS_EVERY_S: per role
    (daemon, code server, intake), per process (a restarted one is a new process)."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.stopping = threading.Event()
        self.samples: dict[tuple[str, int], list[tuple[float, int]]] = {}
        self.born: dict[tuple[str, int], float] = {}

    def run(self) -> None:
        while not self.stopping.wait(RSS_EVERY_S):
            roles = [("daemon", p.pid) for name, p in list(self.fleet.procs.items()) if name == "daemon"]
            roles += [("intake", p.pid) for name, p in list(self.fleet.procs.items()) if name == "intake"]
            roles += [("code_server", pid) for pid in code_servers(self.fleet)]
            now = time.time()
            for key in roles:
                rss = rss_bytes(key[1])
                if rss is None:
                    continue
                if key not in self.born:
                    self.born[key] = started_at(key[1]) or now
                self.samples.setdefault(key, []).append((now, rss))

    def figures(self) -> dict[str, Any]:
        """Per role: each process's memory after its warm-up and at its last sample, and the largest
        growth among those that lived long enough after it to be judged."""
        out: dict[str, Any] = {}
        for (role, pid), samples in sorted(self.samples.items()):
            born = self.born[(role, pid)]
            warm = [(at, rss) for at, rss in samples if at - born >= RSS_WARMUP_S]
            entry = out.setdefault(role, {"processes": [], "judged": 0, "max_growth": None})
            row: dict[str, Any] = {"pid": pid, "lived_s": round(samples[-1][0] - born), "samples": len(samples),
                                   "peak_mb": round(max(rss for _, rss in samples) / 2**20, 1)}
            if warm and warm[-1][0] - warm[0][0] >= RSS_MIN_JUDGED_S:
                growth = warm[-1][1] / warm[0][1] - 1
                row.update(warm_mb=round(warm[0][1] / 2**20, 1), last_mb=round(warm[-1][1] / 2**20, 1),
                           growth=round(growth, 4))
                entry["judged"] += 1
                entry["max_growth"] = growth if entry["max_growth"] is None else max(entry["max_growth"], growth)
            entry["processes"].append(row)
        return out


@dataclass
class RunView:
    run_id: str
    job: str
    batch: bool
    lead_id: str | None
    handover: str | None
    pid: int | None = None
    step_started: bool = False


class Injector:
    """Picks a run in the window due next and kills its worker; also the daemon and the code server."""

    def __init__(self, fleet: Fleet, instance: Any, store: Any, rng: random.Random, lock: threading.Lock) -> None:
        self.fleet, self.instance, self.store, self.rng, self.lock = fleet, instance, store, rng, lock
        self.views: dict[str, RunView] = {}
        self.kills: list[dict[str, Any]] = []
        self.process_kills: list[dict[str, Any]] = []
        self.records_dir = fleet.data_dir / "records"

    def active_runs(self) -> list[RunView]:
        from dagster import DagsterRunStatus, RunsFilter

        runs = self.instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]))
        views = []
        for run in runs:
            if not run.job_name.startswith("collect_"):
                continue
            view = self.views.get(run.run_id)
            if view is None:
                view = RunView(run.run_id, run.job_name, "investigations/batch_size" in run.tags,
                               run.tags.get("investigations/lead_id"), run.tags.get("investigations/handover"))
                self.views[run.run_id] = view
            views.append(view)
        return views

    def _refresh(self, view: RunView) -> None:
        from dagster import DagsterEventType

        if view.pid is None or not view.step_started:
            for entry in self.instance.all_logs(view.run_id, of_type={DagsterEventType.ENGINE_EVENT,
                                                                       DagsterEventType.STEP_START}):
                if entry.dagster_event and entry.dagster_event.event_type == DagsterEventType.STEP_START:
                    view.step_started = True
                elif (match := PID_RE.search(entry.message or "")) and view.pid is None:
                    view.pid = int(match[1])

    def window_of(self, view: RunView, arrivals: dict[str, Any]) -> str | None:
        """The window this run is in now, if any (None: between windows, or not killable)."""
        self._refresh(view)
        if view.pid is None or not _alive(view.pid):
            return None
        if not view.step_started:
            return "launch"
        source = view.job.removeprefix("collect_")
        if not view.batch:
            if view.lead_id is None:
                return None
            if (self.records_dir / source / f"{view.lead_id}.parquet").exists():
                return "after_write"
            value = self._value(view.lead_id)
            return "step" if value and source in arrivals.get(value, {}) else None
        done = self._collected_by(view.run_id)
        owed = self.store.handover_leads(view.handover) if view.handover else []
        if done and owed:
            return "after_write"
        if not done and owed and any(source in arrivals.get(self._value(lead) or "", {}) for lead in owed):
            return "step"
        return None

    def _value(self, lead_id: str) -> str | None:
        lead = self.store.get_lead(lead_id)
        return lead.value if lead else None

    def _collected_by(self, run_id: str) -> list[str]:
        from sqlalchemy import select

        from investigations.store import schema as s

        with self.store.engine.begin() as conn:
            return list(conn.scalars(select(s.collections.c.lead_id).where(s.collections.c.run_id == run_id)))

    def try_kill(self, window: str) -> dict[str, Any] | None:
        arrivals = _arrivals(self.fleet)
        candidates = [v for v in self.active_runs() if self.window_of(v, arrivals) == window]
        if not candidates:
            return None
        view = self.rng.choice(candidates)
        owed = ([view.lead_id] if not view.batch else
                (self.store.handover_leads(view.handover) if view.handover else []))
        done = self._collected_by(view.run_id)
        assert view.pid is not None
        try:
            os.kill(view.pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        kill = {"window": window, "run_id": view.run_id, "job": view.job, "batch": view.batch, "pid": view.pid,
                "at": time.time(), "owed": [lead for lead in owed if lead], "stored_before_kill": done}
        self.kills.append(kill)
        return kill

    def kill_daemon(self) -> dict[str, Any]:
        with self.lock:
            servers = code_servers(self.fleet)
            pid = self.fleet.kill("daemon")
            at = time.time()
        time.sleep(2.0)
        with self.lock:
            self.fleet.start("daemon")
        event = {"what": "daemon", "pid": pid, "at": at, "restarted_at": time.time(), "old_code_servers": servers}
        self.process_kills.append(event)
        return event

    def postgres_outage(self, outage_s: float) -> dict[str, Any]:
        """Crash the fleet's Postgres (every connection cut, no checkpoint), keep it down `outage_s`,
        start it again (through crash recovery), and time the intake's way back: its `/healthz`
        answers 200 only once it reaches the state store again."""
        assert self.fleet.pg is not None
        self.fleet.pg.crash()
        at = time.time()
        time.sleep(outage_s)
        self.fleet.pg.start()
        back = time.time()
        event: dict[str, Any] = {"what": "postgres", "at": at, "down_s": round(outage_s, 1), "restarted_at": back}
        deadline = back + 120.0
        with httpx.Client(trust_env=False, timeout=2) as client:
            while time.time() < deadline:
                try:
                    if client.get(f"{self.fleet.intake_url}/healthz").status_code == 200:
                        event["intake_back_after_s"] = round(time.time() - back, 2)
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        self.process_kills.append(event)
        return event

    def kill_code_server(self, timeout_s: float = 90.0) -> dict[str, Any]:
        servers = code_servers(self.fleet)
        event: dict[str, Any] = {"what": "code_server", "pid": servers[0] if servers else None, "at": time.time()}
        if not servers:
            event["error"] = "no code server found under the daemon"
            self.process_kills.append(event)
            return event
        os.kill(servers[0], signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fresh = [pid for pid in code_servers(self.fleet) if pid != servers[0] and _alive(pid)]
            if fresh:
                event.update(restarted_pid=fresh[0], restarted_after_s=time.time() - event["at"])
                break
            time.sleep(0.5)
        else:
            event["error"] = f"the daemon did not start another code server within {timeout_s:.0f} s"
        self.process_kills.append(event)
        return event


def _arrivals(fleet: Fleet) -> dict[str, Any]:
    try:
        with httpx.Client(trust_env=False, timeout=5) as client:
            return client.get(f"{fleet.sandbox_url}/_bench/arrivals").json()
    except httpx.HTTPError:
        return {}


def wait_daemon(instance: Any, fleet: Fleet, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if code_servers(fleet):
            return
        for name, proc in fleet.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {fleet.logs / (name + '.log')}")
        time.sleep(0.5)
    raise TimeoutError(f"the daemon started no code server within {timeout_s:.0f} s; see {fleet.logs}")


def settled(store: Any, expected: set[tuple[str, str]]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(collected, dead-lettered) among the expected (source, lead) pairs."""
    from sqlalchemy import select

    from investigations.store import schema as s

    with store.engine.begin() as conn:
        ok = {(r.source, r.lead_id) for r in conn.execute(
            select(s.collections.c.source, s.collections.c.lead_id).where(s.collections.c.outcome.in_(["ok", "empty"])))}
        dead = {(r.source, r.lead_id) for r in conn.execute(select(s.dead_letters.c.source, s.dead_letters.c.lead_id))}
    return ok & expected, (dead - ok) & expected


def run_backend(backend: str, args: Any, workdir: Path) -> dict[str, Any]:
    from dagster import DagsterInstance

    from investigations.demo.fleet import wait_http
    from investigations.intake.leads import normalize_lead
    from investigations.store import StateStore

    rng = random.Random(f"{args.seed}:{backend}")
    intake_kills = max(1, args.kills // 10)
    deliveries = plan_deliveries(backend, args.leads, args.interactive_share, rng, intake_kills)
    backfill_leads = sum(len(d.values) for d in deliveries if d.source == BACKFILL_SOURCE)
    pg = PostgresServer() if backend == "postgres" else None
    if pg is not None:
        pg.start()
    fleet = prepare(backend, workdir / backend, backfill_leads=backfill_leads, pg=pg)
    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    instance.get_runs(limit=1)  # Dagster's storage exists before any fleet process would create it
    store = StateStore.from_url(fleet.database_url)
    lock = threading.Lock()
    expected = {(d.source, normalize_lead("domain", v).id) for d in deliveries for v in d.values}
    interval_s = args.send_s / max(1, len(deliveries))
    watch = FileWatch(fleet.data_dir / "records")
    rss = RssSampler(fleet)
    injector = Injector(fleet, instance, store, rng, lock)
    sender = Sender(fleet, deliveries, interval_s, lock)
    timeline: dict[str, float] = {}
    try:
        for name in ("sandbox", "intake", "daemon"):
            fleet.start(name)
        wait_http(f"{fleet.sandbox_url}/healthz", timeout_s=60, procs=list(fleet.procs.values()))
        _control(fleet, INTERACTIVE_SOURCE, {"delay_s": list(ROBUST_DELAY_S)})
        wait_http(f"{fleet.intake_url}/healthz", timeout_s=60, procs=list(fleet.procs.values()))
        wait_daemon(instance, fleet, timeout_s=START_TIMEOUT_S)
        print(f"  [{backend}] fleet up; {len(deliveries)} deliveries ({len(expected)} collections) over "
              f"{args.send_s:.0f} s, {args.kills} run worker kills, {intake_kills} intake kill(s), daemon "
              f"{args.daemon_kills}x, code server once"
              + (f", Postgres {args.pg_restarts}x" if pg is not None else "") + f" (logs: {fleet.logs})", flush=True)
        timeline["start"] = time.time()
        watch.start()
        rss.start()
        sender.start()
        kill_gap_s = args.send_s / max(1, args.kills)
        next_kill = time.time() + rng.uniform(0.3, 1.0) * kill_gap_s
        # The daemon kills from 35 % of the sending on, the code server at 40 %, the Postgres
        # crashes from 50 %; several of one kind are spread evenly over what is left. A crash of
        # Postgres waits SETTLE_S after the code server's replacement, the daemon's last restart
        # and its own last return, and a daemon kill SETTLE_S after Postgres' last return: what
        # comes back after the database's return is then the database's recovery, not a code
        # server's replacement (at the daemon's next workspace refresh, up to a minute) or a
        # daemon's start.
        daemon_due = spread(0.35, args.daemon_kills, len(deliveries))
        postgres_due = spread(0.5, args.pg_restarts if pg is not None else 0, len(deliveries))
        code_server_at = 0.4 * len(deliveries)
        windows = [WINDOWS[n % len(WINDOWS)] for n in range(args.kills)]
        rng.shuffle(windows)
        give_up = time.time() + args.send_s + args.kill_grace_s
        next_check = 0.0
        while windows or sender.is_alive() or daemon_due or postgres_due or "code_server" not in timeline:
            if (daemon_due and sender.sent >= daemon_due[0]
                    and time.time() >= timeline.get("postgres_back", 0.0) + SETTLE_S):
                daemon_due.pop(0)
                timeline.setdefault("daemon", time.time())
                print(f"  [{backend}] kill -9 daemon: {injector.kill_daemon()}", flush=True)
                wait_daemon(instance, fleet, timeout_s=START_TIMEOUT_S)
                timeline["daemon_back"] = time.time()
            if (postgres_due and "daemon" in timeline and sender.sent >= postgres_due[0]
                    and time.time() >= max(timeline.get("code_server_back", float("inf")),
                                           timeline.get("daemon_back", 0.0),
                                           timeline.get("postgres_back", 0.0)) + SETTLE_S):
                postgres_due.pop(0)
                timeline.setdefault("postgres", time.time())
                print(f"  [{backend}] Postgres crashed (pg_ctl -m immediate) and started again: "
                      f"{injector.postgres_outage(args.pg_outage_s)}", flush=True)
                timeline["postgres_back"] = time.time()
            if "code_server" not in timeline and "daemon" in timeline and sender.sent >= code_server_at:
                timeline["code_server"] = time.time()
                print(f"  [{backend}] kill -9 code server: {injector.kill_code_server()}", flush=True)
                timeline["code_server_back"] = time.time()
            if windows and time.time() >= next_kill:
                # The window due first; once it has waited PATIENCE_S for a run, any other still owed
                # a kill that has a run in it now.
                order = list(dict.fromkeys(windows)) if time.time() >= next_kill + PATIENCE_S else windows[:1]
                kill = next((k for w in order if (k := injector.try_kill(w)) is not None), None)
                if kill is not None:
                    windows.remove(kill["window"])
                    print(f"  [{backend}] kill -9 run worker [{kill['window']}] {kill['run_id'][:8]} "
                          f"({kill['job']}, owed {len(kill['owed'])})", flush=True)
                    next_kill = time.time() + rng.uniform(0.5, 1.5) * kill_gap_s
            if time.time() > give_up:
                print(f"  [{backend}] no run in the windows {windows} came up in time; going on", flush=True)
                break
            if not sender.is_alive() and time.time() >= next_check:
                next_check = time.time() + 5.0
                ok, dead = settled(store, expected)
                if len(ok) + len(dead) == len(expected) and not _runs_in_flight(instance):
                    print(f"  [{backend}] every collection settled before the windows {windows} came up", flush=True)
                    break
            if sender.error:
                raise RuntimeError(f"sender: {sender.error}")
            time.sleep(POLL_S)
        sender.join(timeout=600)
        kill_times = ([k["at"] for k in injector.kills] + [k["at"] for k in injector.process_kills]
                      + [k["at"] for k in sender.intake_kills])
        timeline["last_kill"] = max(kill_times) if kill_times else time.time()
        timeline["sent"] = time.time()
        print(f"  [{backend}] sending and kills done; waiting for every collection to settle", flush=True)
        deadline = time.time() + args.settle_timeout_s
        last_report = 0.0
        while time.time() < deadline:
            ok, dead = settled(store, expected)
            if len(ok) + len(dead) == len(expected):
                timeline["settled"] = time.time()
                break
            if time.time() - last_report > 30:
                last_report = time.time()
                print(f"  [{backend}]   {len(ok)} collected, {len(dead)} dead-lettered of {len(expected)}", flush=True)
            if "daemon" not in fleet.procs or fleet.procs["daemon"].poll() is not None:
                raise RuntimeError(f"the daemon exited; see {fleet.logs / 'daemon.log'}")
            time.sleep(1.0)
        drain_until = time.time() + DRAIN_S
        while time.time() < drain_until and _runs_in_flight(instance):
            time.sleep(1.0)
        timeline["end"] = time.time()
    finally:
        watch.stopping.set()
        rss.stopping.set()
        with lock:
            for name in ("daemon", "intake"):
                proc = fleet.procs.pop(name, None)
                if proc is not None:
                    fleet.retired.append(proc)
            from investigations.demo.fleet import stop_all

            stop_all(fleet.retired)
            fleet.retired.clear()
    try:
        print(f"  [{backend}] fleet stopped; undisturbed pass and figures", flush=True)
        reference = reference_pass(fleet, store, expected)
        figures = analyse(fleet, instance, store, deliveries, expected, injector, sender, watch, reference, timeline)
        figures["rss"] = rss.figures()
    finally:
        fleet.stop()
        store.close()
        instance.dispose()
        if pg is not None:
            if args.keep:
                print(f"  [{backend}] Postgres kept running on port {pg.port}, data in {pg.data}")
            else:
                pg.cleanup()
    figures["config"] = {"backend": backend, "leads": args.leads, "deliveries": len(deliveries),
                         "collections": len(expected), "backfill_leads": backfill_leads,
                         "interactive_leads": len(expected) - backfill_leads, "run_worker_kills": args.kills,
                         "intake_kills": intake_kills, "send_s": args.send_s, "daemon_kills": args.daemon_kills,
                         "pg_restarts": args.pg_restarts if pg is not None else 0, "soak": args.soak}
    figures["verdict"] = verdict(figures, postgres=pg is not None, soak=args.soak)
    return figures


def spread(start: float, count: int, deliveries: int) -> list[float]:
    """`count` points (in deliveries sent) from `start` of the sending on, evenly over what is left."""
    return [deliveries * (start + (1 - start) * n / count) for n in range(count)] if count > 0 else []


def _runs_in_flight(instance: Any) -> int:
    from dagster import DagsterRunStatus, RunsFilter

    return instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus[s] for s in RUN_FLIGHT]))


def reference_pass(fleet: Fleet, store: Any, expected: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Content hash of every expected collection as the engine alone collects it, undisturbed, from the
    same sandbox (its answers are a pure function of source and lead): the files to compare with."""
    from concurrent.futures import ThreadPoolExecutor

    from investigations.collection.collect import Collector
    from investigations.collection.fetcher import Fetcher
    from investigations.evidence.records import RecordStore
    from investigations.sources.catalog import load_catalog
    from investigations.store import StateStore

    _control(fleet, INTERACTIVE_SOURCE, {"delay_s": [0.0, 0.0]})
    _control(fleet, BACKFILL_SOURCE, {"delay_s": [0.0, 0.0]})
    ref_dir = fleet.base / "reference"
    ref_dir.mkdir()
    ref_store = StateStore.from_url(f"sqlite:///{ref_dir / 'state.db'}")
    leads = {lead for _, lead in expected}
    for lead_id in leads:
        lead = store.get_lead(lead_id)
        if lead is not None:
            ref_store.add_lead(lead)
    os.environ["INVESTIGATIONS_SANDBOX_URL"] = fleet.sandbox_url  # the sources file names the sandbox by it
    catalog = load_catalog(Path(fleet.env["INVESTIGATIONS_SOURCES"]))
    fetcher = Fetcher(sink=ref_store)
    collector = Collector(catalog=catalog, store=ref_store, records=RecordStore(ref_dir / "records"), fetcher=fetcher)
    out: dict[tuple[str, str], str] = {}

    def one(pair: tuple[str, str]) -> None:
        try:
            out[pair] = collector.collect(pair[0], pair[1]).content_hash
        except Exception as exc:  # reported as a missing reference
            out[pair] = f"error: {exc}"

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, sorted(expected)))
    fetcher.close()
    ref_store.close()
    return out


def analyse(fleet: Fleet, instance: Any, store: Any, deliveries: list[Delivery], expected: set[tuple[str, str]],
            injector: Injector, sender: Sender, watch: FileWatch, reference: dict[tuple[str, str], str],
            timeline: dict[str, float]) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from dagster import DagsterRunStatus
    from sqlalchemy import select

    from investigations.evidence.records import RecordStore
    from investigations.identities.leasing import lease_ttl_s
    from investigations.sources.catalog import load_catalog
    from investigations.store import schema as s

    ok, dead = settled(store, expected)
    lost = sorted(expected - ok - dead)
    records = RecordStore(fleet.data_dir / "records")
    dup_keys, differing, missing_files, rewritten_same, two_contents = [], [], [], [], []
    for source, lead in sorted(ok):
        path = records.path_for(source, lead)
        if not path.exists():
            missing_files.append(f"{source}/{lead}")
            continue
        keys = pq.read_table(path, columns=["record_key"]).column("record_key").to_pylist()
        if len(keys) != len(set(keys)):
            dup_keys.append(f"{source}/{lead}")
        if RecordStore.stored_hash(path) != reference.get((source, lead)):
            differing.append(f"{source}/{lead}: stored {RecordStore.stored_hash(path)}, "
                             f"undisturbed {reference.get((source, lead))}")
        versions = watch.versions.get(f"{source}/{lead}", [])
        if len({h for _, _, h in versions}) > 1:
            two_contents.append(f"{source}/{lead}")
        elif len(versions) > 1:
            rewritten_same.append(f"{source}/{lead}")
    run_records = instance.get_run_records()
    runs = [record.dagster_run for record in run_records]
    by_id = {run.run_id: run for run in runs}
    times = {r.dagster_run.run_id: (r.start_time, r.end_time) for r in run_records}
    statuses = Counter(run.status.value for run in runs)
    stuck = [run.run_id for run in runs if run.status in (DagsterRunStatus.STARTING, DagsterRunStatus.STARTED)]
    in_flight = [run.run_id for run in runs if run.status.value in RUN_FLIGHT]
    with store.engine.begin() as conn:
        colls = {(r.source, r.lead_id): r.run_id for r in conn.execute(
            select(s.collections.c.source, s.collections.c.lead_id, s.collections.c.run_id))}
        ok_fetch_runs: dict[tuple[str, str], set[str]] = {}
        for r in conn.execute(select(s.fetch_log.c.source, s.fetch_log.c.lead_id, s.fetch_log.c.run_id)
                              .where(s.fetch_log.c.outcome == "ok")):
            ok_fetch_runs.setdefault((r.source, r.lead_id), set()).add(r.run_id)
        leases = [dict(r) for r in conn.execute(select(s.identity_leases)).mappings()]
        queue_open = conn.execute(select(s.collection_queue.c.state, s.collection_queue.c.source)
                                  .where(s.collection_queue.c.state != "done")).all()
        deaths = conn.execute(select(s.collection_queue.c.run_deaths)).scalars().all()
    collected_twice = sorted(f"{k[0]}/{k[1]}" for k, v in ok_fetch_runs.items() if k in expected and len(v) > 1)
    # Leases: one left unreleased by a killed run must run out within its TTL; none is held past it.
    catalog = load_catalog(Path(fleet.env["INVESTIGATIONS_SOURCES"]))
    now = time.time()
    unreleased = [lease for lease in leases if not lease["released"] and lease["holder"]]
    past_ttl = []
    for lease in unreleased:
        holder = by_id.get(lease["holder"])
        ended = times[holder.run_id][1] if holder else None
        ttl = lease_ttl_s(catalog.get(lease["source"]))
        if lease["expires_at_s"] > now and (ended is None or lease["expires_at_s"] > ended + ttl + 5):
            if holder is None or holder.is_finished:
                past_ttl.append({k: lease[k] for k in ("source", "identity_id", "holder", "expires_at_s")})
    # Evidence per window: a killed run that failed, whose leads all settled, and that a later run
    # finished for it: a Dagster retry of it that succeeded, or a successful run that collected one of
    # its leads under a new handover (a new run key).
    evidence: dict[str, Counter[str]] = {w: Counter() for w in WINDOWS}
    kills_out = []
    for kill in injector.kills:
        killed = by_id.get(kill["run_id"])
        source = kill["job"].removeprefix("collect_")
        entry = evidence[kill["window"]]
        entry["killed"] += 1
        failed = killed is not None and killed.status == DagsterRunStatus.FAILURE
        entry["killed_run_failed"] += failed
        root = killed.tags.get("dagster/root_run_id", killed.run_id) if killed else None
        retries = [r for r in runs if r.run_id != kill["run_id"] and r.tags.get("dagster/root_run_id") == root
                   and r.status == DagsterRunStatus.SUCCESS and _started(times, r) > kill["at"]]
        collectors = {colls.get((source, lead)) for lead in kill["owed"]}
        # Another run of another handover stored what the killed one owed (whatever that run's own end:
        # one that stored them and then failed, in a Postgres outage say, still stored them).
        others = [by_id[rid] for rid in collectors if rid in by_id and rid != kill["run_id"]
                  and by_id[rid].tags.get("investigations/handover") != (killed.tags.get("investigations/handover")
                                                                         if killed else None)]
        owed_settled = all((source, lead) in ok or (source, lead) in dead for lead in kill["owed"])
        kept = [lead for lead in kill["owed"] if colls.get((source, lead)) == kill["run_id"]]
        # Killed after writing: what it owed may all be stored already, and nothing is left to recover.
        via = ("dagster_retry" if retries else "new_handover" if others
               else "stored_before_death" if kept and len(kept) == len(kill["owed"]) else None)
        recovered = failed and owed_settled and via is not None
        if recovered:
            entry["recovered"] += 1
            entry[f"via_{via}"] += 1
        entry["lead_stored_by_the_killed_run"] += bool(kept)
        kills_out.append({**kill, "status_at_end": killed.status.value if killed else None, "recovered": recovered,
                          "via": via, "retries_succeeded": [r.run_id for r in retries],
                          "collected_by_new_handover": sorted(r.run_id for r in others),
                          "stored_by_the_killed_run": kept,
                          "run_keys_after": sorted({r.tags.get("dagster/run_key", "") for r in retries + others})})
    daemon = next((k for k in injector.process_kills if k["what"] == "daemon"), None)
    code_server = next((k for k in injector.process_kills if k["what"] == "code_server"), None)
    postgres_outages = [k for k in injector.process_kills if k["what"] == "postgres"]
    postgres = postgres_outages[0] if postgres_outages else None
    started_after = lambda at: sum(1 for start, _ in times.values() if start and start > at)  # noqa: E731
    if daemon:
        daemon["runs_started_after_restart"] = started_after(daemon["restarted_at"])
    if code_server:
        code_server["runs_started_after"] = started_after(code_server["at"])
    ticks = sensor_ticks(instance)
    launches = run_launches(instance)
    for outage in postgres_outages:
        back = outage["restarted_at"]
        outage["runs_started_after_restart"] = started_after(back)
        first_run = min((start for start, _ in times.values() if start and start > back), default=None)
        outage["first_run_started_after_s"] = round(first_run - back, 2) if first_run else None
        first_tick = min((tick_start for tick_start, ok in ticks if ok and tick_start > back), default=None)
        outage["first_sensor_tick_after_s"] = round(first_tick - back, 2) if first_tick else None
        first_launch = min((at for at in launches if at > back), default=None)
        outage["first_run_launched_after_s"] = round(first_launch - back, 2) if first_launch else None
    redelivered_ok = sum(1 for k in sender.intake_kills if k["status"] == 202 and not k["accepted"]
                         and len(k["duplicates"]) == k["leads"])
    recover_s = (timeline["settled"] - timeline["last_kill"]) if "settled" in timeline else None
    figures = {
        "accepted_collections": len(expected),
        "collected": len(ok),
        "dead_lettered": len(dead),
        "dead_letter_reasons": dict(Counter(d.reason_group for d in store.dead_letters() if (d.source, d.lead_id) in dead)),
        "lost": len(lost),
        "lost_sample": lost[:10],
        "duplicates": len(dup_keys) + len(two_contents),
        "duplicate_record_keys": dup_keys[:10],
        "files_with_two_contents": two_contents[:10],
        "files_rewritten_same_content": len(rewritten_same),
        "collected_by_more_than_one_run": len(collected_twice),
        "files_differing_from_undisturbed": len(differing),
        "files_differing_sample": differing[:10],
        "files_missing": len(missing_files),
        "undisturbed_pass_errors": sum(1 for h in reference.values() if h.startswith("error")),
        "runs_stuck": len(stuck),
        "runs_stuck_ids": stuck[:10],
        "runs_in_flight_at_end": len(in_flight),
        "runs_by_status": dict(statuses),
        "queue_rows_open_at_end": dict(Counter(f"{state}:{source}" for state, source in queue_open)),
        "queue_rows_with_run_deaths": sum(1 for d in deaths if d),
        "leases_unreleased_at_end": len(unreleased),
        "leases_held_past_ttl": len(past_ttl),
        "leases_held_past_ttl_sample": past_ttl[:5],
        "time_to_recover_s": recover_s,
        "evidence": {w: dict(c) for w, c in evidence.items()},
        "run_worker_kills": kills_out,
        "intake_kills": sender.intake_kills,
        "intake_redeliveries_all_duplicates": redelivered_ok,
        "daemon_kill": daemon,
        "code_server_kill": code_server,
        "postgres_outage": postgres,
        "postgres_outages": postgres_outages,
        "sender_error": sender.error,
        "timeline_s": {k: round(v - timeline["start"], 1) for k, v in timeline.items()},
    }
    return figures


def sensor_ticks(instance: Any) -> list[tuple[float, bool]]:
    """Every sensor tick Dagster recorded: (when it started, whether it succeeded or skipped)."""
    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.scheduler.instigation import TickStatus

    out = []
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id):
            out.append((tick.timestamp, tick.status in (TickStatus.SUCCESS, TickStatus.SKIPPED)))
    return out


def run_launches(instance: Any, page: int = 10_000) -> list[float]:
    """When the daemon launched each run (its RUN_STARTING event): the daemon's own act, where a
    run's start (RUN_START) is also its new worker process's spawn and imports. Read a page at a
    time (Dagster returns at most 10,000 records per call)."""
    from dagster import DagsterEventType

    out: list[float] = []
    cursor = None
    while True:
        result = instance.fetch_run_status_changes(DagsterEventType.RUN_STARTING, limit=page, cursor=cursor,
                                                   ascending=True)
        out.extend(record.timestamp for record in result.records)
        if not result.has_more:
            return out
        cursor = result.cursor


def _started(times: dict[str, tuple[float | None, float | None]], run: Any) -> float:
    return times.get(run.run_id, (None, None))[0] or 0.0


def verdict(f: dict[str, Any], *, postgres: bool = False, soak: bool = False) -> dict[str, Any]:
    checks = {
        "0 lost": f["lost"] == 0,
        "0 duplicated": f["duplicates"] == 0,
        "0 differing from undisturbed": f["files_differing_from_undisturbed"] == 0 and f["files_missing"] == 0,
        "0 stuck": f["runs_stuck"] == 0,
        "0 leases past TTL": f["leases_held_past_ttl"] == 0,
        "settled": f["time_to_recover_s"] is not None,
        "intake kill hit, redelivery answered as duplicate": bool(f["intake_kills"])
        and f["intake_redeliveries_all_duplicates"] == len(f["intake_kills"]),
        "daemon killed and restarted, runs after": bool(f["daemon_kill"])
        and f["daemon_kill"].get("runs_started_after_restart", 0) > 0,
        "code server killed and replaced": bool(f["code_server_kill"]) and "error" not in f["code_server_kill"],
    }
    if postgres:
        checks["Postgres crashed and restarted, runs after"] = bool(f["postgres_outage"]) and (
            f["postgres_outage"].get("runs_started_after_restart", 0) > 0)
    for window in WINDOWS:
        checks[f"window {window}: a killed run recovered"] = f["evidence"][window].get("recovered", 0) > 0
    if soak:
        outages = f.get("postgres_outages") or []
        checks["Postgres restarted as planned"] = len(outages) == f.get("config", {}).get("pg_restarts", len(outages))
        # Each process that lives through the outage (the intake, the daemon's sensors and its run
        # queue) is judged; a run's start after it is reported (`_back`), not judged: its worker is a
        # new process, whose spawn and imports take seconds of CPU when several start at once.
        for what in ("intake_back_after_s", "first_sensor_tick_after_s", "first_run_launched_after_s"):
            times = [outage.get(what) for outage in outages]
            checks[f"after each Postgres return: {what.removesuffix('_s')} <= {RECONNECT_GOAL_S:g} s"] = bool(
                outages) and all(t is not None and t <= RECONNECT_GOAL_S for t in times)
        for role in ("daemon", "intake"):
            entry = (f.get("rss") or {}).get(role) or {}
            checks[f"{role}: memory grows < {RSS_GOAL:.0%} after warm-up"] = bool(entry.get("judged")) and (
                entry["max_growth"] < RSS_GOAL)
    return {"passed": all(checks.values()), "checks": checks}


# -- report --------------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> None:
    names = list(results["backends"])
    rows = []
    for label, key in (("accepted collections", "accepted_collections"), ("collected", "collected"),
                       ("dead-lettered", "dead_lettered"), ("LOST", "lost"), ("DUPLICATED", "duplicates"),
                       ("files differing from undisturbed", "files_differing_from_undisturbed"),
                       ("runs STUCK (STARTING/STARTED)", "runs_stuck"), ("leases held past TTL", "leases_held_past_ttl"),
                       ("leases left by killed runs (expire by TTL)", "leases_unreleased_at_end"),
                       ("time to recover, last kill -> all settled (s)", "time_to_recover_s"),
                       ("collected by more than one run", "collected_by_more_than_one_run"),
                       ("files rewritten with the same content", "files_rewritten_same_content"),
                       ("intake kills, redelivery all duplicates", "intake_redeliveries_all_duplicates")):
        rows.append([label, *(results["backends"][n][key] for n in names)])
    for window in WINDOWS:
        rows.append([f"{window}: killed / recovered (Dagster retry + new run key)",
                     *(_ev(results["backends"][n]["evidence"][window]) for n in names)])
    rows.append(["daemon: runs started after restart",
                 *((results["backends"][n]["daemon_kill"] or {}).get("runs_started_after_restart") for n in names)])
    rows.append(["code server: replaced after (s)",
                 *(_cs(results["backends"][n]["code_server_kill"]) for n in names)])
    rows.append(["Postgres: down (s), runs started after",
                 *(_pg(results["backends"][n].get("postgres_outage")) for n in names)])
    if results["config"].get("soak"):
        rows.append(["Postgres returns: intake / sensor tick / run launched (started) after (s)",
                     *(_back(results["backends"][n].get("postgres_outages") or []) for n in names)])
        for role in ("daemon", "intake", "code_server"):
            rows.append([f"{role}: memory growth after warm-up (max; processes judged)",
                         *(_rss((results["backends"][n].get("rss") or {}).get(role)) for n in names)])
    rows.append(["verdict", *("PASS" if results["backends"][n]["verdict"]["passed"] else "FAIL" for n in names)])
    cfg = results["config"]
    print_table(f"Fault suite: {cfg['leads']} leads, {cfg['kills']} run worker kills + intake, daemon and code "
                f"server kills", ["", *names], rows)
    for n in names:
        failed = [k for k, v in results["backends"][n]["verdict"]["checks"].items() if not v]
        if failed:
            print(f"  {n}: failed checks: {', '.join(failed)}")


def _ev(entry: dict[str, int]) -> str:
    stored = entry.get("via_stored_before_death", 0)
    return (f"{entry.get('killed', 0)} / {entry.get('recovered', 0)} "
            f"({entry.get('via_dagster_retry', 0)}+{entry.get('via_new_handover', 0)}"
            + (f", {stored} stored all it owed before it died" if stored else "") + ")")


def _pg(event: dict[str, Any] | None) -> str:
    return f"{event['down_s']:g}, {event.get('runs_started_after_restart', 0)}" if event else "-"


def _back(outages: list[dict[str, Any]]) -> str:
    return "; ".join(f"{o.get('intake_back_after_s')} / {o.get('first_sensor_tick_after_s')} / "
                     f"{o.get('first_run_launched_after_s')} ({o.get('first_run_started_after_s')})"
                     for o in outages) or "-"


def _rss(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    growth = entry.get("max_growth")
    return f"{growth:+.1%} ({entry['judged']} of {len(entry['processes'])})" if growth is not None else (
        f"not judged (0 of {len(entry['processes'])} lived {RSS_WARMUP_S + RSS_MIN_JUDGED_S:.0f} s)")


def _cs(event: dict[str, Any] | None) -> str:
    if not event:
        return "-"
    return event.get("error") or f"{event.get('restarted_after_s', 0):.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--soak", action="store_true",
                        help=f"the long run (`make soak`): defaults become {SOAK}, and reconnection and memory "
                             "growth are judged too")
    parser.add_argument("--leads", type=int, default=None, help="leads sent by webhook (default 2000)")
    parser.add_argument("--kills", type=int, default=None,
                        help="run worker kills (default 40), spread over the windows")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default=None, help="default both")
    parser.add_argument("--daemon-kills", type=int, default=None, help="daemon kills (default 1)")
    parser.add_argument("--pg-restarts", type=int, default=None,
                        help="postgres backend: how many times its server crashes and starts again (default 1)")
    parser.add_argument("--interactive-share", type=float, default=0.25,
                        help="share of leads sent as interactive (default 0.25); the rest as backfill")
    parser.add_argument("--send-s", type=float, default=None,
                        help="how long the sending lasts (default: 1.2 s per interactive lead, at least 60 s)")
    parser.add_argument("--kill-grace-s", type=float, default=600.0,
                        help="after the sending, how long to look for runs in the windows still due")
    parser.add_argument("--settle-timeout-s", type=float, default=None,
                        help="after the sending, how long every collection has to settle (default: 0.9 s per "
                             "lead, at least 900 s; on two cores 2,000 leads took about 16 minutes on SQLite)")
    parser.add_argument("--pg-outage-s", type=float, default=10.0,
                        help="postgres backend: how long the fleet's Postgres stays down after its crash (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--keep", action="store_true", help="keep temp dirs and Postgres databases")
    args = parser.parse_args(argv)
    defaults = {"backend": "both", "leads": 2000, "kills": 40, "pg_restarts": 1, "daemon_kills": 1}
    for name, value in {**defaults, **(SOAK if args.soak else {})}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.send_s is None:
        args.send_s = max(60.0, 1.2 * args.leads * args.interactive_share)
    if args.settle_timeout_s is None:
        args.settle_timeout_s = max(900.0, 0.9 * args.leads)
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt(signum)))
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    results: dict[str, Any] = {"config": {"leads": args.leads, "kills": args.kills, "backends": backends,
                                          "interactive_share": args.interactive_share, "send_s": args.send_s,
                                          "seed": args.seed, "soak": args.soak, "pg_restarts": args.pg_restarts,
                                          "daemon_kills": args.daemon_kills},
                               "engine": engine_digest(), "host_before": host_load(),
                               "started_at": datetime.now(UTC).isoformat(), "backends": {}}
    workdir = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    try:
        for backend in backends:
            print(f"\n--- {backend} ---", flush=True)
            started = time.time()
            results["backends"][backend] = run_backend(backend, args, workdir)
            results["backends"][backend]["wall_s"] = round(time.time() - started, 1)
        results["host_after"] = host_load()
        report(results)
        path = write_results("soak" if args.soak else NAME, results, args.results_dir)
        print(f"\nfigures: {path}")
    finally:
        if args.keep:
            print(f"temp dirs kept: {workdir}")
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(b["verdict"]["passed"] for b in results["backends"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
