"""What every bench shares: worker processes that drive the real `Fetcher`, and the figures made from them.

A worker is a spawned process (as one Dagster run of a source would be) with a few threads, each
owning one `Fetcher`. Every attempt is recorded with its send time, stamped by the HTTP transport
just before the request leaves, and its status: figures come from what went on the wire. Workers
stop by themselves at a shared deadline: the fetcher's injected sleep raises once the deadline is
reached, so no wait (rate lane, Retry-After, backoff) can outlive the run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing as mp
import os
import queue
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"
READY_TIMEOUT_S = 120.0  # spawned workers import the engine first; on a busy 2-core box that takes seconds
STOP_GRACE_S = 30.0  # after the deadline: the longest in-flight request (a source timeout) plus reporting
START_DELAY_S = 0.5  # the common start lies this far after the last worker said it was ready
NO_ANSWER = 0  # the status recorded for an attempt that got no HTTP answer (timeout, reset)
PERIODOGRAM_BIN_S = 0.05  # 20 Hz: Nyquist (10 Hz) is above every lane's request rate
PERIODOGRAM_MAX_PERIOD_S = 10.0  # mechanical timing repeats at the request-interval scale, not minutes

Row = tuple[float, int, float]  # (sent at, wall-clock s; HTTP status or NO_ANSWER; latency ms)


@dataclass(frozen=True)
class WorkerPlan:
    """One worker process: the group its figures belong to, its identity, its source, its pacing.

    `spec` is a `SourceSpec` dumped to JSON (validated again in the worker). `paced` gives the worker
    `RateLanes` in the group's store (the fleet as designed); without it the fetcher sends as soon as
    asked. `fixed_delay_s` adds a sleep of delay x U(0.5, 1.5) after every fetch (the classic "polite
    scraper").
    """

    group: str
    identity_id: str
    spec: dict[str, Any]
    store_url: str
    paced: bool
    threads: int = 1
    fixed_delay_s: float | None = None
    seed: int = 0


@dataclass
class WorkerResult:
    """What one worker saw: one row per attempt, fetch outcomes, and any error that stopped a thread."""

    group: str
    identity_id: str
    rows: list[Row] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """A finished run of workers: the common start, the deadline and every worker's result."""

    start_s: float
    deadline_s: float
    workers: list[WorkerResult]

    @property
    def duration_s(self) -> float:
        return self.deadline_s - self.start_s

    def rows(self, group: str, identity_id: str | None = None) -> list[Row]:
        """Attempts of `group` (of one identity, if given) sent between start and deadline, by send time."""
        picked = [
            row
            for w in self.workers
            if w.group == group and (identity_id is None or w.identity_id == identity_id)
            for row in w.rows
            if self.start_s <= row[0] < self.deadline_s
        ]
        return sorted(picked)

    def identities(self, group: str) -> list[str]:
        return [w.identity_id for w in self.workers if w.group == group]

    def outcomes(self, group: str) -> dict[str, int]:
        total: Counter[str] = Counter()
        for w in self.workers:
            if w.group == group:
                total.update(w.outcomes)
        return dict(total)

    def errors(self) -> list[str]:
        return [f"{w.group}/{w.identity_id}: {e}" for w in self.workers for e in w.errors]


class DeadlineReached(Exception):
    """The run is over: raised from the injected sleep so every wait inside the fetcher ends with it."""


class DeadlineSleep:
    """`time.sleep` that never sleeps past the deadline, and raises `DeadlineReached` when it is reached."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s

    def __call__(self, seconds: float) -> None:
        remaining_s = self.deadline_s - time.time()
        if seconds >= remaining_s:
            time.sleep(max(0.0, remaining_s))
            raise DeadlineReached
        time.sleep(max(0.0, seconds))


class _StampingTransport(httpx.HTTPTransport):
    """The real transport, noting when each request is handed to the socket (the arrival the server sees)."""

    sent_at_s: float = 0.0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent_at_s = time.time()
        return super().handle_request(request)


class _Recorder:
    """The fetcher's sink: one row per attempt, then the event on to the store's fetch log as in the fleet."""

    def __init__(self, transport: _StampingTransport, rows: list[Row], forward: Any) -> None:
        self._transport, self._rows, self._forward = transport, rows, forward

    def record_fetch(self, event: Any) -> None:
        self._rows.append((self._transport.sent_at_s, event.status or NO_ANSWER, event.latency_ms))
        self._forward.record_fetch(event)


class _Driver:
    """One worker thread: its own `Fetcher`, built before the start so imports and TLS setup don't eat
    into the run; `drive()` then sends new leads, one after another, until the deadline."""

    def __init__(self, plan: WorkerPlan, thread_no: int, store: Any, lanes: Any) -> None:
        from investigations.adapters import build_adapter
        from investigations.collection.fetcher import Fetcher
        from investigations.sources.specs import SourceSpec

        self.plan, self.thread_no = plan, thread_no
        self.rng = random.Random(plan.seed * 1009 + thread_no)
        self.sleep = DeadlineSleep(math.inf)  # the deadline is set when the start is known
        self.rows: list[Row] = []
        self.outcomes: Counter[str] = Counter()
        self.error: str | None = None
        self.spec = SourceSpec.model_validate(plan.spec)
        self.adapter = build_adapter(self.spec)
        transport = _StampingTransport()
        self.fetcher = Fetcher(sink=_Recorder(transport, self.rows, store), identity_id=plan.identity_id,
                               rng=self.rng, sleep=self.sleep, transport=transport, lanes=lanes,
                               user_agent=f"bench/{plan.group}/{plan.identity_id}")

    def drive(self, deadline_s: float) -> None:
        from investigations.collection.fetcher import FetchFailed, FetchParked
        from investigations.intake.leads import normalize_lead

        self.sleep.deadline_s = deadline_s
        plan, n = self.plan, 0
        try:
            with self.fetcher:
                while time.time() < deadline_s:
                    lead = normalize_lead("username", f"{plan.identity_id}.{self.thread_no}.{n}")
                    n += 1
                    for request in self.adapter.requests_for(lead):
                        try:
                            self.fetcher.fetch(self.spec, request, lead_id=lead.id)
                            self.outcomes["done"] += 1
                        except FetchParked:
                            # A parked collection is requeued for later; other runs of the source carry
                            # on with other leads at once, so the worker does too.
                            self.outcomes["parked"] += 1
                        except FetchFailed as exc:
                            self.outcomes[f"failed:{exc.reason_group}"] += 1
                    if plan.fixed_delay_s is not None:
                        self.sleep(plan.fixed_delay_s * self.rng.uniform(0.5, 1.5))
        except DeadlineReached:
            pass
        except Exception:  # a bench reports what broke a worker rather than dying silently
            self.error = traceback.format_exc(limit=5)


def _worker_main(index: int, plan: WorkerPlan, duration_s: float, messages: Any, go: Any,
                 start_at: Synchronized) -> None:  # type: ignore[type-arg]
    """Entry of a spawned worker: set up, say ready, wait for the common start, drive its threads."""
    result = WorkerResult(plan.group, plan.identity_id)
    try:
        from investigations.pacing import GapSampler, RateLanes
        from investigations.store import StateStore

        store = StateStore.from_url(plan.store_url)
        lanes = RateLanes(store, sampler=GapSampler(random.Random(plan.seed))) if plan.paced else None
        drivers = [_Driver(plan, n, store, lanes) for n in range(plan.threads)]
        messages.put(("ready", index, None))
        if not go.wait(READY_TIMEOUT_S):
            raise RuntimeError("no start signal")
        start_s = float(start_at.value)
        time.sleep(max(0.0, start_s - time.time()))
        threads = [threading.Thread(target=d.drive, args=(start_s + duration_s,)) for d in drivers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for driver in drivers:
            result.rows.extend(driver.rows)
            result.outcomes.update(driver.outcomes)
            result.errors += [driver.error] if driver.error else []
        store.close()
    except Exception:  # reported to the parent, which prints it
        result.errors.append(traceback.format_exc(limit=5))
    finally:
        messages.put(("done", index, result))


def run_workers(plans: Sequence[WorkerPlan], *, duration_s: float,
                during: Callable[[float], None] | None = None) -> Run:
    """Spawn one process per plan, start them together, let them run `duration_s`, collect their rows.

    `during(start_s)` runs in this process once the workers have started (to change the sandbox
    mid-run, say); it must return before the deadline. Workers that do not report in time are ended.
    """
    from investigations.store import StateStore

    for url in sorted({plan.store_url for plan in plans}):
        StateStore.from_url(url).close()  # migrate once here, before the workers race to
    ctx = mp.get_context("spawn")
    messages, go, start_at = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_worker_main, args=(i, plan, duration_s, messages, go, start_at),
                    name=f"bench-{plan.group}-{plan.identity_id}", daemon=True)
        for i, plan in enumerate(plans)
    ]
    results: dict[int, WorkerResult] = {}
    start_s = time.time()
    try:
        for proc in procs:
            proc.start()
        waiting, ready_by = set(range(len(procs))), time.time() + READY_TIMEOUT_S
        while waiting:
            kind, index, payload = messages.get(timeout=max(0.1, ready_by - time.time()))
            waiting.discard(index)
            if kind == "done":  # failed during setup
                results[index] = payload
        start_s = time.time() + START_DELAY_S
        start_at.value = start_s
        go.set()
        if during is not None:
            during(start_s)
        report_by = start_s + duration_s + STOP_GRACE_S
        while len(results) < len(procs):
            try:
                kind, index, payload = messages.get(timeout=max(0.1, report_by - time.time()))
            except queue.Empty:
                break
            if kind == "done":
                results[index] = payload
    except queue.Empty:
        raise RuntimeError(f"workers not ready within {READY_TIMEOUT_S:.0f} s") from None
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()  # only our own worker, by its handle
                proc.join(timeout=5)
    workers = [results.get(i) or WorkerResult(p.group, p.identity_id, errors=["did not report"])
               for i, p in enumerate(plans)]
    return Run(start_s, start_s + duration_s, workers)


# -- figures -------------------------------------------------------------------------------------


def status_counts(rows: Iterable[Row]) -> dict[str, int]:
    """Attempts by status ("0" = no HTTP answer), keys sorted."""
    counts = Counter(str(code) for _, code, _ in rows)
    return dict(sorted(counts.items()))


def ok_count(rows: Iterable[Row]) -> int:
    return sum(1 for _, code, _ in rows if 200 <= code < 300)


def timeline(rows: Sequence[Row], start_s: float, end_s: float, bin_s: float) -> list[dict[str, Any]]:
    """OK answers per second and 429s per `bin_s` bin from the start: how a run evolved."""
    bins = []
    at = start_s
    while at < end_s:
        upto = min(at + bin_s, end_s)
        picked = [r for r in rows if at <= r[0] < upto]
        bins.append({"from_s": at - start_s, "ok_per_s": ok_count(picked) / (upto - at),
                     "throttled": sum(1 for r in picked if r[1] == 429)})
        at = upto
    return bins


def gap_cv(times: Sequence[float]) -> float | None:
    """Coefficient of variation of the gaps between consecutive arrivals (0: a metronome, 1: Poisson)."""
    if len(times) < 3:
        return None
    gaps = np.diff(np.sort(np.asarray(times)))
    mean = float(gaps.mean())
    return float(gaps.std() / mean) if mean > 0 else None


def periodogram_peak(times: Sequence[float], start_s: float, end_s: float, *,
                     bin_s: float = PERIODOGRAM_BIN_S,
                     max_period_s: float = PERIODOGRAM_MAX_PERIOD_S) -> dict[str, float | None]:
    """The strongest period in the arrival series: peak power / mean power, and its period.

    Arrivals are counted in `bin_s` bins, the mean removed, and the FFT power read for periods up to
    `max_period_s`. `noise_peak_ratio` is what the same ratio is expected to be without any period
    (the largest of n exponential powers over their mean, the harmonic number H_n): a peak far above
    it is a fixed rhythm; one near it is noise.
    """
    empty: dict[str, float | None] = {"peak_ratio": None, "peak_period_s": None, "noise_peak_ratio": None}
    n_bins = int((end_s - start_s) / bin_s)
    if n_bins < 16 or len(times) < 3:
        return empty
    counts, _ = np.histogram(np.asarray(times), bins=n_bins, range=(start_s, start_s + n_bins * bin_s))
    power = np.abs(np.fft.rfft(counts - counts.mean())) ** 2
    freqs = np.fft.rfftfreq(n_bins, d=bin_s)
    band = freqs >= 1.0 / max_period_s
    band[0] = False
    in_band = power[band]
    if in_band.size == 0 or float(in_band.mean()) == 0.0:
        return empty
    peak = int(np.argmax(in_band))
    return {
        "peak_ratio": float(in_band[peak] / in_band.mean()),
        "peak_period_s": float(1.0 / freqs[band][peak]),
        "noise_peak_ratio": float(np.sum(1.0 / np.arange(1, in_band.size + 1))),
    }


def lane_figures(rows: Sequence[Row], start_s: float, end_s: float) -> dict[str, Any]:
    """Timing of one lane's arrivals (every attempt it sent): count, rate, gap CV and periodogram peak."""
    times = [t for t, _, _ in rows]
    return {"requests": len(times), "rate_per_s": len(times) / (end_s - start_s), "gap_cv": gap_cv(times),
            **periodogram_peak(times, start_s, end_s)}


# -- plumbing ------------------------------------------------------------------------------------


def host_load() -> dict[str, Any]:
    """CPUs and load averages now: figures from a busy shared box read differently from an idle one."""
    return {"cpus": os.cpu_count(), "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def engine_digest() -> str:
    """12 hex of a sha256 over the engine's sources (`investigations/**/*.py`) the figures came from.

    The engine's pacing changes often; figures must say which version of it they measured.
    """
    root = Path(__file__).resolve().parent.parent / "investigations"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def epoch_s(value: datetime | float | None) -> float | None:
    """A stored time as seconds since the epoch: a naive datetime (SQLite gives those back) is UTC."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return float(value)


class Service:
    """A helper process a bench starts on `with` and always cleans up, started or not."""

    def start(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def cleanup(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.cleanup()


def free_port() -> int:
    """A loopback port nobody listens on right now (the caller retries if it is taken before use)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dump_spec(spec: Any) -> dict[str, Any]:
    """A `SourceSpec` as plain JSON data, to cross into a spawned worker and be validated again there."""
    return dict(spec.model_dump(mode="json"))


def parse_args(argv: Sequence[str] | None, *, description: str, default_duration_s: float,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The options every bench takes: `--duration-s` and `--results-dir`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--duration-s", type=float, default=default_duration_s,
                        help=f"measured seconds (default {default_duration_s:g})")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help=f"where the JSON goes (default {RESULTS_DIR})")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.duration_s <= 0:
        parser.error("--duration-s must be above 0")
    return args


def write_results(name: str, figures: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write `figures` to `<results_dir>/<name>.json` (the folder is created; it is git-ignored)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    return path


def report_host(figures: dict[str, Any]) -> None:
    """The host's load before and after the run, and the errors the run met (on stderr)."""
    host = figures["host"]
    print(f"  host load (1/5/15 min) before {host['before']['load_avg_1_5_15']}, after "
          f"{host['after']['load_avg_1_5_15']} on {host['before']['cpus']} CPUs")
    for error in figures["errors"]:
        print(f"  error: {error}", file=sys.stderr)


def finish(name: str, figures: dict[str, Any], results_dir: Path) -> int:
    """Write the figures, say where, and the exit status: 1 when the run met errors."""
    print(f"\n  figures written to {write_results(name, figures, results_dir)}")
    return 1 if figures["errors"] else 0


class ToolMissing(RuntimeError):
    """A program a bench drives (nginx, tinyproxy) is not on this machine; the message says how to install it."""


def find_tool(name: str, *places: str) -> str | None:
    """`name` on the PATH, else the first of `places` that exists (Debian puts daemons in /usr/sbin,
    often not on a user's PATH), or None."""
    return shutil.which(name) or next((p for p in places if Path(p).is_file()), None)


def fmt(value: Any) -> str:
    """A table cell: '-' for nothing, floats to a precision that reads well for ratios and rates."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a plain aligned table (readable in a terminal and pasteable into a ticket)."""
    cells = [list(header)] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        pairs = enumerate(zip(row, widths, strict=True))
        padded = (cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in pairs)
        print("  " + "  ".join(padded))
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))


# -- Postgres for the benches that run a fleet on it ------------------------------------------------

POSTGRES_URL = os.environ.get(
    "INVESTIGATIONS_BENCH_POSTGRES_URL",
    os.environ.get("INVESTIGATIONS_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"),
)


def pg_admin(sql: str, *, server: str = POSTGRES_URL) -> None:
    """One statement on the bench's Postgres server, outside a transaction (CREATE/DROP DATABASE)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


@contextmanager
def bench_workdir(prefix: str, *, keep: bool) -> Iterator[Path]:
    """A temp dir for a bench's fleets, removed afterwards unless `keep` (then its path is printed)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield workdir
    finally:
        if keep:
            print(f"temp dirs kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def fresh_databases(prefix: str, *, wanted: bool) -> Iterator[list[str]]:
    """Two fresh databases on the bench's Postgres server, the state store's and Dagster's storage's
    (in that order), dropped afterwards; none when not `wanted` (a SQLite fleet)."""
    databases: list[str] = []
    try:
        if wanted:
            stamp = f"{int(time.time())}_{uuid.uuid4().hex[:6]}"
            for db in (f"{prefix}_{stamp}_state", f"{prefix}_{stamp}_dagster"):
                pg_admin(f'CREATE DATABASE "{db}"')
                databases.append(db)
        yield databases
    finally:
        for db in databases:
            pg_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def pg_server_pid(*, server: str = POSTGRES_URL) -> int | None:
    """The pid of the Postgres server process (the postmaster) when it runs on this machine, else None.

    A backend's parent is the postmaster; its process tree holds every backend, and the time of the
    backends that ended is in its children's counters, so sampling the tree counts the server's work.
    """
    from sqlalchemy import create_engine, text

    engine = create_engine(server)
    try:
        with engine.connect() as conn:
            backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        stat = Path(f"/proc/{backend}/stat").read_text()
    except (OSError, ValueError):
        return None
    finally:
        engine.dispose()
    return int(stat.rsplit(")", 1)[1].split()[1])


def pg_url(db: str, *, server: str = POSTGRES_URL) -> str:
    """The bench server's URL for database `db`."""
    head, _, _ = server.rpartition("/")
    return f"{head}/{db}"


def dagster_postgres_storage(db: str, *, server: str = POSTGRES_URL) -> dict[str, Any]:
    """A dagster.yaml `storage:` block putting Dagster's runs, events and schedules in `db`."""
    from sqlalchemy.engine import make_url

    url = make_url(server)
    return {"postgres": {"postgres_db": {
        "username": url.username or "postgres", "hostname": url.host or "127.0.0.1", "port": url.port or 5432,
        "db_name": db, "scheme": "postgresql+psycopg2", **({"password": url.password} if url.password else {})}}}
