"""A real fleet for benches: start it on loopback, watch its processes' CPU, stop it; plus two helper processes.

Used by `bench.urgent`; anything that needs the whole fleet (Dagster and all) can use it too.

- `start_fleet(...)` starts, as `make run` does, the sandbox web, the webhook intake and `dagster dev`
  (webserver, daemon, one shared code server; run workers are children of the code server), each in
  a session of its own, in temp dirs with free loopback ports; or `dagster-daemon` alone (`daemon`:
  run queue, sensors, its code server and run workers, no webserver), as a deployment runs it.
  `Fleet.stop()` ends them by group.
- `CpuSampler` reads `/proc/<pid>/stat` of every process under given roots, every `interval_s`.
- `python -m bench.fleet_process sandbox ...`: the sandbox web in its own process (so its CPU is its
  own), with a middleware that notes when the first request for each watched lead value arrived.
- `python -m bench.fleet_process engine ...`: the same collections done by the engine alone (one
  process, `Collector` + `Fetcher` + rate lanes, no Dagster) and the CPU seconds they took.
- `defs_multiprocess` (loaded lazily): the fleet's `Definitions` with Dagster's multiprocess executor
  instead of the in-process one, for a workspace that wants to compare the two.

No Dagster import at module level: the sandbox and engine processes never load Dagster.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from investigations.demo.fleet import DAGSTER_ENV

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 120.0  # `dagster dev` needs 4-12 s; a loaded 2-core box more
SECRET = "whsec_YmVuY2gtdXJnZW50LWxhdGVuY3ktc2VjcmV0LWZvci1sb29wYmFjaw=="


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- /proc ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    start_ticks: int  # with pid, names one process (pids are reused)
    self_s: float  # utime + stime
    children_s: float  # cutime + cstime: children that ended and were reaped

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_ticks)


def read_stat(pid: int) -> ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its last ')'.
    rest = raw[raw.rindex(")") + 2:].split()
    # rest[0] is field 3 (state); ppid is field 4, utime..cstime 14..17, starttime 22.
    return ProcStat(pid=pid, ppid=int(rest[1]), start_ticks=int(rest[19]),
                    self_s=(int(rest[11]) + int(rest[12])) / CLK_TCK,
                    children_s=(int(rest[13]) + int(rest[14])) / CLK_TCK)


def proc_table() -> dict[int, ProcStat]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := read_stat(int(name))) is not None:
            table[stat.pid] = stat
    return table


def descendants(root: int, table: Mapping[int, ProcStat]) -> list[int]:
    """`root` and every process under it (by parent pid), as the table saw them."""
    children: dict[int, list[int]] = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


_ROLE_CACHE: dict[tuple[int, int], str] = {}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role_of(stat: ProcStat) -> str:
    """What a process of the fleet is, from its command line (cached per process)."""
    if stat.key in _ROLE_CACHE:
        return _ROLE_CACHE[stat.key]
    try:
        cmd = Path(f"/proc/{stat.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "unknown"
    if "dagster._daemon" in cmd or "dagster-daemon" in cmd or "dagster_daemon" in cmd:
        role = "daemon"
    elif "dagster_webserver" in cmd or "dagster-webserver" in cmd:
        role = "webserver"
    elif "watch_orphans" in cmd or cmd.startswith("tail "):
        role = "run log capture"  # per run: `tail -F` + a Python watcher for stdout and for stderr
    elif "multiprocessing.spawn" in cmd or "execute_run" in cmd or "execute_step" in cmd:
        role = "run worker"
    elif "multiprocessing.forkserver" in cmd:
        # The fleet's run launcher forks each run worker from its template process, so both show the
        # template's command line: a worker is a child of the template.
        role = "run worker" if "multiprocessing.forkserver" in _cmdline(stat.ppid) else "run launcher template"
    elif "api grpc" in cmd or "code-server" in cmd or "code_server" in cmd or "resource_tracker" in cmd:
        role = "code server"
    elif " dev " in cmd and "dagster" in cmd:
        role = "dagster dev"
    elif not cmd.strip():
        role = "exited, not yet reaped"
    else:
        role = "other: " + cmd[:60]
    if cmd:  # an empty cmdline (zombie) is not cached: it was seen earlier with its real one
        _ROLE_CACHE[stat.key] = role
    return role


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores, every process) since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    # guest time is already counted in user/nice.
    return (sum(ticks[:8]) - idle) / CLK_TCK


@dataclass
class CpuSample:
    at_s: float
    machine_busy_s: float
    own_s: float  # the sampling process's own CPU (the bench), to tell it apart from the machine's rest
    # group -> CPU seconds of the group so far: its live processes' own and reaped children's time.
    totals: dict[str, float]
    # (pid, start) -> (group, role, own CPU seconds) of every live process.
    procs: dict[tuple[int, int], tuple[str, str, float]]


class CpuSampler:
    """Samples the CPU time of process trees (one per group root) every `interval_s` in a thread.

    A group's total at a moment is the sum, over its live processes, of utime + stime + cutime +
    cstime: a process that ends is reaped by its parent (in the tree), and its time moves into the
    parent's cutime/cstime, so the total never drops. Per role (daemon, code server, run worker...),
    time is read from each process's own counters while it lives; what a short process spent after
    its last sample shows only in the total (reported as `between samples`).
    """

    def __init__(self, groups: Mapping[str, int | Sequence[int]], interval_s: float = 0.5) -> None:
        # A group may have several roots: the daemon and a code server run as a service of its own.
        self.groups = {name: (roots,) if isinstance(roots, int) else tuple(roots) for name, roots in groups.items()}
        self.interval_s = interval_s
        self.samples: list[CpuSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def sample(self) -> CpuSample:
        table = proc_table()
        totals: dict[str, float] = {}
        procs: dict[tuple[int, int], tuple[str, str, float]] = {}
        for group, roots in self.groups.items():
            total = 0.0
            for pid in dict.fromkeys(pid for root in roots for pid in descendants(root, table)):
                stat = table[pid]
                total += stat.self_s + stat.children_s
                role = role_of(stat)
                # Outside Dagster's tree a process is just its group's (the intake, the sandbox, the engine).
                procs[stat.key] = (group, role if group == "dagster" or not role.startswith("other") else "process",
                                   stat.self_s)
            totals[group] = total
        own = read_stat(os.getpid())
        return CpuSample(time.time(), machine_busy_s(), own.self_s if own else 0.0, totals, procs)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.interval_s)

    def window(self, start_s: float, end_s: float) -> dict[str, Any]:
        """CPU seconds per group and per (group, role) between the samples nearest `start_s` and `end_s`."""
        inside = [s for s in self.samples if start_s <= s.at_s <= end_s]
        if len(inside) < 2:
            return {"seconds": 0.0, "groups": {}, "roles": {}, "processes": {}, "machine_busy_s": 0.0}
        first, last = inside[0], inside[-1]
        groups = {g: last.totals.get(g, 0.0) - first.totals.get(g, 0.0) for g in self.groups}
        # Per process: the last value seen in the window minus the first (0 for one born inside it).
        latest: dict[tuple[int, int], tuple[str, str, float]] = {}
        for sample in inside:
            latest.update(sample.procs)
        roles: dict[str, float] = {}
        processes: dict[str, int] = {}
        for key, (group, role, cpu) in latest.items():
            base = first.procs[key][2] if key in first.procs else 0.0
            roles[f"{group}/{role}"] = roles.get(f"{group}/{role}", 0.0) + cpu - base
            processes[f"{group}/{role}"] = processes.get(f"{group}/{role}", 0) + 1
        for group, total in groups.items():
            seen = sum(v for k, v in roles.items() if k.startswith(f"{group}/"))
            if total - seen > 0.005:
                roles[f"{group}/between samples"] = total - seen
        return {"seconds": last.at_s - first.at_s, "groups": groups, "roles": dict(sorted(roles.items())),
                "processes": dict(sorted(processes.items())),
                "machine_busy_s": last.machine_busy_s - first.machine_busy_s,
                "bench_s": last.own_s - first.own_s}


# -- the fleet -----------------------------------------------------------------------------------


@dataclass
class Fleet:
    base: Path
    env: dict[str, str]
    sandbox_url: str
    intake_url: str
    ui_url: str
    dagster_home: Path
    data_dir: Path
    database_url: str
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.logs / (name + '.log')}")

    def sleep_until(self, at_s: float) -> None:
        """Sleep until the wall clock reads `at_s`, failing as soon as one of the fleet's processes exits."""
        while (left := at_s - time.time()) > 0:
            self.check_alive()
            time.sleep(min(left, 1.0))

    def stop(self) -> None:
        from investigations.demo.fleet import stop_all

        stop_all(list(self.procs.values()))


def prepare_fleet(base: Path, *, dagster_yaml: str, sources_yaml: str, workspace_yaml: str | None = None,
                  watch_prefix: str = "") -> Fleet:
    """Temp dirs, config files and ports of a fleet; nothing is started yet (see `start_fleet`)."""
    dagster_home, data_dir, logs = base / "dagster_home", base / "data", base / "logs"
    for folder in (dagster_home, data_dir, logs):
        folder.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text(dagster_yaml)
    (base / "sources.yaml").write_text(sources_yaml)
    workspace = ROOT / "workspace.yaml"
    if workspace_yaml is not None:
        workspace = base / "workspace.yaml"
        workspace.write_text(workspace_yaml)
    sandbox_port, intake_port, ui_port, code_port = free_port(), free_port(), free_port(), free_port()
    database_url = f"sqlite:///{data_dir / 'state.db'}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("INVESTIGATIONS_", "DAGSTER_"))},
        "DAGSTER_HOME": str(dagster_home),
        "INVESTIGATIONS_DATA_DIR": str(data_dir),
        "INVESTIGATIONS_DATABASE_URL": database_url,
        "INVESTIGATIONS_SOURCES": str(base / "sources.yaml"),
        "INVESTIGATIONS_SANDBOX_URL": f"http://127.0.0.1:{sandbox_port}",
        "INVESTIGATIONS_SANDBOX_PORT": str(sandbox_port),
        "INVESTIGATIONS_WEBHOOK_SECRET": SECRET,
        "INVESTIGATIONS_INTAKE_PORT": str(intake_port),
        "INVESTIGATIONS_UI_PORT": str(ui_port),
        # The code server of `deploy/workspace.yaml` (the `code-server` service below).
        "INVESTIGATIONS_CODE_SERVER_HOST": "127.0.0.1",
        "INVESTIGATIONS_CODE_SERVER_PORT": str(code_port),
        "BENCH_WORKSPACE": str(workspace),
        "BENCH_WATCH_PREFIX": watch_prefix,
        **DAGSTER_ENV,  # as `make run` sets them
    }
    return Fleet(base=base, env=env, sandbox_url=env["INVESTIGATIONS_SANDBOX_URL"],
                 intake_url=f"http://127.0.0.1:{intake_port}", ui_url=f"http://127.0.0.1:{ui_port}",
                 dagster_home=dagster_home, data_dir=data_dir, database_url=database_url, logs=logs)


def start_fleet(fleet: Fleet, *, timeout_s: float = START_TIMEOUT_S,
                services: Sequence[str] = ("sandbox", "intake", "dagster")) -> None:
    """Sandbox, intake and `dagster dev`, each in its own session; return once all three answer.

    `services` picks some of them (the sandbox alone, say, for the engine-only measurement), or adds
    `daemon`: `dagster-daemon run` on the workspace instead of `dagster dev` (no HTTP port: whoever
    starts it watches its work arrive), and `code-server`: the project's code server as a service of
    its own, as a deployment runs it for `deploy/workspace.yaml` (start it before the daemon).

    Dagster's storage must exist before this (create the `DagsterInstance` first: processes that
    create the same SQLite storage at once can leave it with two schema heads). On failure every
    process already started is stopped.
    """
    from investigations.demo.fleet import wait_http

    env = fleet.env
    sandbox_port = env["INVESTIGATIONS_SANDBOX_PORT"]
    commands = {
        "sandbox": [sys.executable, "-m", "bench.fleet_process", "sandbox", "--port", sandbox_port,
                    "--watch-prefix", env["BENCH_WATCH_PREFIX"]],
        "intake": [str(BIN / "investigations"), "intake"],
        "dagster": [str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", env["INVESTIGATIONS_UI_PORT"],
                    "-w", env["BENCH_WORKSPACE"]],
        "daemon": [str(BIN / "dagster-daemon"), "run", "-w", env["BENCH_WORKSPACE"]],
        "code-server": [str(BIN / "dagster"), "code-server", "start", "-m", "definitions", "-d", str(ROOT),
                        "-h", env["INVESTIGATIONS_CODE_SERVER_HOST"], "-p", env["INVESTIGATIONS_CODE_SERVER_PORT"],
                        "--location-name", "investigations"],
    }
    commands = {name: cmd for name, cmd in commands.items() if name in services}
    urls = {"sandbox": f"{fleet.sandbox_url}/healthz", "intake": f"{fleet.intake_url}/healthz",
            "dagster": f"{fleet.ui_url}/server_info"}
    try:
        for name, cmd in commands.items():
            with open(fleet.logs / f"{name}.log", "wb") as log:
                fleet.procs[name] = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True,
                                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        procs = list(fleet.procs.values())
        for name in commands:
            if name in urls:
                wait_http(urls[name], timeout_s=timeout_s, procs=procs)
            elif name == "code-server":
                wait_code_server(env["INVESTIGATIONS_CODE_SERVER_HOST"], int(env["INVESTIGATIONS_CODE_SERVER_PORT"]),
                                 timeout_s=timeout_s, procs=procs)
    except BaseException:
        fleet.stop()
        raise


def wait_code_server(host: str, port: int, *, timeout_s: float, procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Return once the code server at host:port lists the project's definitions: a daemon that finds
    it still loading keeps the error until its next workspace refresh, 60 s later."""
    from dagster._grpc.client import DagsterGrpcClient
    from dagster._serdes import deserialize_value
    from dagster._utils.error import SerializableErrorInfo

    client = DagsterGrpcClient(host=host, port=port)
    deadline = time.monotonic() + timeout_s
    while True:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a fleet process exited with {proc.returncode} while the code server started")
        try:
            if not isinstance(deserialize_value(client.list_repositories()), SerializableErrorInfo):
                return
        except Exception:  # not listening yet, or still loading the code
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the code server at {host}:{port} did not load the project in {timeout_s:.0f} s")
        time.sleep(0.5)


# -- the sandbox, in a process of its own, noting first arrivals ---------------------------------


class ArrivalLog:
    """ASGI middleware: the first time a request for a watched lead value reached the sandbox.

    The lead value is the `q` query parameter (JSON sources) or the last path segment (HTML
    sources). Stamped when the request reaches the app, before the source's own behaviour runs.
    """

    def __init__(self, app: Any, prefix: str) -> None:
        self.app, self.prefix = app, prefix
        self.first: dict[str, dict[str, float]] = {}  # value -> {source: epoch s}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            now = time.time()
            path = scope.get("path", "")
            if path == "/_bench/arrivals":
                body = json.dumps(self.first).encode()
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
            if self.prefix:
                parts = path.strip("/").split("/")
                qs = parse_qs(scope.get("query_string", b"").decode())
                value = qs["q"][0] if "q" in qs else unquote(parts[-1]) if parts else ""
                if value.startswith(self.prefix) and parts and parts[0]:
                    self.first.setdefault(value, {}).setdefault(parts[0], now)
        await self.app(scope, receive, send)


def serve_sandbox(port: int, *, watch_prefix: str, seed: int = 7) -> None:
    import uvicorn

    from investigations.sandbox import SandboxConfig, create_app

    # quiet with records: the bench's recurring crawls should store something, like a healthy source.
    app = ArrivalLog(create_app(SandboxConfig(seed=seed, quiet_empty=False)), watch_prefix)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the engine alone ----------------------------------------------------------------------------


def run_engine(plan: Mapping[str, int], *, deadline_s: float, seed: int) -> dict[str, Any]:
    """Collect `plan[source]` fresh leads per source, all sources at once, each with its own pool of
    `concurrency` threads sharing one `Collector` (as one run of the source does), over the engine
    the fleet's resource opens (`investigations.composition`): the same rate lanes and circuits,
    and identities leased from the fleet's pool when `INVESTIGATIONS_IDENTITIES` names a file. CPU is this
    process's own (all threads) during the collections only: imports and setup
    are left out, as a long-running fleet pays them once."""
    from investigations.collection.collect import CollectionFailed, CollectionParked, Collector
    from investigations.composition import open_engine
    from investigations.config import Settings
    from investigations.intake.leads import normalize_lead
    from investigations.sources.catalog import load_catalog
    from investigations.store import StateStore

    settings = Settings.from_env()
    catalog = load_catalog(settings.sources_path)
    store = StateStore.from_url(settings.database_url)
    work: dict[str, list[str]] = {}
    for source, count in plan.items():
        leads = [normalize_lead("domain", f"engine-{source}-{n}.example") for n in range(count)]
        for lead in leads:
            store.add_lead(lead)
        work[source] = [lead.id for lead in leads]
    outcomes: dict[str, dict[str, int]] = {source: {} for source in plan}
    lock = threading.Lock()

    def one(source: str, collector: Collector, lead_id: str) -> None:
        if time.time() >= deadline_s:
            outcome = "not started (deadline)"
        else:
            try:
                # As the fleet's batches collect: background work, standing back from booked slots.
                outcome = collector.collect(source, lead_id, background=True).outcome
            except CollectionParked:
                outcome = "parked"
            except CollectionFailed as exc:
                outcome = f"failed:{exc.reason_group}"
        with lock:
            outcomes[source][outcome] = outcomes[source].get(outcome, 0) + 1

    engine = open_engine(settings, store=store, rng=random.Random(seed))
    pools = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    start_s = time.time()
    for source, lead_ids in work.items():
        spec = catalog.get(source)
        collector = engine.collector(catalog)
        pool = ThreadPoolExecutor(max_workers=spec.concurrency, thread_name_prefix=f"engine-{source}")
        pools.append(pool)
        for lead_id in lead_ids:
            pool.submit(one, source, collector, lead_id)
    for pool in pools:
        pool.shutdown(wait=True)
    wall_s = time.time() - start_s
    after = resource.getrusage(resource.RUSAGE_SELF)
    engine.close()
    store.close()
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # Finished collections (stored or given up), as the fleet's queue counts them; parked ones are not.
    collected = {source: sum(v for k, v in counts.items() if k in ("ok", "empty") or k.startswith("failed"))
                 for source, counts in outcomes.items()}
    return {"plan": dict(plan), "outcomes": outcomes, "collected": collected, "cpu_s": cpu_s, "wall_s": wall_s}


def engine_subprocess(plan: Mapping[str, int], *, env: Mapping[str, str], deadline_s: float, seed: int,
                      log: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start `run_engine` in a process of its own; its JSON answer goes to `<log>.json`."""
    out = log.with_suffix(".json")
    cmd = [sys.executable, "-m", "bench.fleet_process", "engine", "--plan", json.dumps(dict(plan)),
           "--deadline-s", str(deadline_s), "--seed", str(seed), "--out", str(out)]
    with open(log, "wb") as handle:
        proc = subprocess.Popen(cmd, env=dict(env), cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=handle, stderr=subprocess.STDOUT)
    return proc, out


# -- Dagster definitions with another executor (for a bench workspace) ---------------------------


def __getattr__(name: str) -> Any:
    # Built on first access only: the sandbox and engine processes import this module without Dagster.
    if name == "defs_multiprocess":
        from dagster import multiprocess_executor
        from dagster_shared.record import copy

        from definitions import build_definitions

        value = copy(build_definitions(), executor=multiprocess_executor)
        globals()[name] = value
        return value
    raise AttributeError(name)


def workspace_yaml(attribute: str) -> str:
    """A workspace loading `bench.fleet_process:<attribute>` as the fleet's code location."""
    return (
        "load_from:\n"
        "  - python_module:\n"
        "      module_name: bench.fleet_process\n"
        f"      attribute: {attribute}\n"
        f"      working_directory: {ROOT}\n"
        "      location_name: investigations\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="helper processes of the fleet benches")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sandbox = sub.add_parser("sandbox")
    sandbox.add_argument("--port", type=int, required=True)
    sandbox.add_argument("--watch-prefix", default="")
    sandbox.add_argument("--seed", type=int, default=7)
    engine = sub.add_parser("engine")
    engine.add_argument("--plan", required=True, help='JSON {"source": leads}')
    engine.add_argument("--deadline-s", type=float, required=True, help="epoch seconds")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "sandbox":
        serve_sandbox(args.port, watch_prefix=args.watch_prefix, seed=args.seed)
        return 0
    result = run_engine(json.loads(args.plan), deadline_s=args.deadline_s, seed=args.seed)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
