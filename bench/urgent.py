"""Urgent latency under load: how long a fresh lead waits while a big backfill and recurring crawls run.

For each mode a whole fleet is started on loopback as `make run` starts it (`dagster dev`: webserver,
daemon, code server, run workers; the webhook intake; the sandbox web, in its own process), in temp
dirs with free ports. Before it starts, the state store is given the load:

- a backfill of `--leads` domain leads for `robust` and `slow`, queued in the fleet's backlog
  (`collection_queue`) as `backfill` work, every lead already a partition of `leads` so batches form;
- `--monitored` leads in an active case whose last success on `quiet` and `slow` is two days old,
  with those sources' `recrawl_every` set to 120 s, so the `recurring_crawls` sensor keeps queueing
  recurring batches during the whole run.

Once the first backfill request reaches the sandbox (t0), `--webhooks` signed webhooks are sent at
random moments (seeded; the same moments in every mode) between 10 % and 75 % of `--duration-s`,
each a fresh lead for `robust`, the source the backfill keeps busy. The run ends at t0 + duration.
For each webhook: sent -> first request for that lead at the sandbox (stamped by the sandbox itself
when the request arrives; the fleet's fetch log, `at - latency_ms`, gives a cross-check) and
sent -> records stored (`collections.last_success_at`). A lead not reached or not stored by the end
is counted as unfinished, with its elapsed time as a lower bound: a percentile that falls on one is
shown as `>x` (p95 of 20 is the 19th value, nearest rank).

Modes:
- `priority`: the repo's dagster.yaml (background runs capped at 3 of 6 run slots) and the webhook
  as `interactive` (first in the backlog, dagster/priority 100, one lead per run).
- `fifo`: the same dagster.yaml without `tag_concurrency_limits` (no headroom) and the webhook sent
  with `"priority": "backfill"`: one class, served in arrival order, behind the backfill already
  queued. (Recurring work on other sources keeps its class; it does not touch `robust`'s backlog.)

CPU: every process under `dagster dev`, the intake and the sandbox are sampled from /proc every
0.5 s; over the steady part of the run (10 % of the duration to the end) the fleet's CPU seconds
(Dagster's processes + intake; the sandbox is the web, reported apart) per finished collection are
compared with the CPU seconds per collection of the engine alone: after the modes, one process runs
`Collector` + `Fetcher` + rate lanes (no Dagster) against a fresh sandbox over the same mix of
sources as the `priority` fleet finished (scaled down to `--engine-leads`). Dagster share =
1 - engine CPU per collection / fleet CPU per collection: what running the collections under
Dagster (run worker processes and their imports, event log, daemon, sensors, webserver, code
server) costs beyond the collection work itself.
"""

from __future__ import annotations

import json
import math
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import epoch_s, parse_args, print_table, write_results
from bench.fleet_process import (
    ROOT,
    CpuSampler,
    Fleet,
    engine_subprocess,
    prepare_fleet,
    start_fleet,
    workspace_yaml,
)

NAME = "urgent"
DEFAULT_DURATION_S = 240.0
DEFAULT_LEADS = 2000
DEFAULT_WEBHOOKS = 20
DEFAULT_MONITORED = 100
DEFAULT_ENGINE_LEADS = 600
MODES = ("priority", "fifo")
URGENT_SOURCE = "robust"
BACKFILL_SOURCES = ("robust", "slow")
RECURRING_SOURCES = ("quiet", "slow")
RECRAWL_EVERY_S = 120
SEND_FROM, SEND_UNTIL = 0.10, 0.75  # webhooks go out in this part of the run
CPU_FROM = 0.10  # the CPU window starts here (after the first batches ramp up) and ends with the run
T0_TIMEOUT_S = 120.0  # from the fleet answering to the first backfill request at the sandbox
ENGINE_TIMEOUT_S = 300.0
GOAL_P95_FIRST_S = 10.0
GOAL_DAGSTER_SHARE = 0.10
WATCH_PREFIX = "urgent-"
STAGES = (
    ("sent -> queued", "new_leads tick ingests the inbox row (sensor interval 5 s)"),
    ("queued -> dispatched", "backlog: max_in_flight room"),
    ("dispatched -> run created", "the tick's run requests become queued runs"),
    ("run created -> dequeued", "Dagster run queue: dequeue interval, run slots, source pool"),
    ("dequeued -> run started", "run worker process start, imports, resources"),
    ("run started -> first request", "collection start, rate lanes"),
    ("first request -> stored", "answer, parse, Parquet, state store"),
)


# -- configuration of a mode --------------------------------------------------------------------


NOOP_COMPUTE_LOGS = {"module": "dagster._core.storage.noop_compute_log_manager", "class": "NoOpComputeLogManager"}


def _set_path(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        config = config.setdefault(key, {})
    config[leaf] = value


def parse_settings(items: Sequence[str]) -> list[tuple[str, Any]]:
    """`a.b=value` pairs; the value is read as YAML (`5`, `true`, `{x: 1}`)."""
    pairs = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not key.path=value")
        pairs.append((key.strip(), yaml.safe_load(raw)))
    return pairs


def mode_dagster_yaml(mode: str, *, dequeue_interval_s: int | None, compute_logs: str = "local",
                      settings: Sequence[tuple[str, Any]] = ()) -> str:
    """The repo's dagster.yaml; `fifo` drops the headroom; then the bench's overrides, if any."""
    config = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    if compute_logs == "noop":
        config["compute_logs"] = NOOP_COMPUTE_LOGS
    for key, value in settings:
        _set_path(config, key, value)
    if mode == "fifo":
        config["concurrency"]["runs"].pop("tag_concurrency_limits", None)
    if dequeue_interval_s is not None:
        config.setdefault("run_queue", {})["dequeue_interval_seconds"] = dequeue_interval_s
    return yaml.safe_dump(config, sort_keys=False)


def bench_sources_yaml(settings: Sequence[tuple[str, Any]] = ()) -> str:
    """The repo's sources; the recurring sources re-crawl every 120 s so they keep working during a run.

    `settings` are `source.key.path` overrides (`robust.max_in_flight`, `*.batch_max_leads` for all).
    """
    config = yaml.safe_load((ROOT / "sources.yaml").read_text())
    for entry in config["sources"]:
        if entry["name"] in RECURRING_SOURCES:
            entry["recrawl_every"] = RECRAWL_EVERY_S
        for key, value in settings:
            source, _, path = key.partition(".")
            if source in ("*", entry["name"]):
                _set_path(entry, path, value)
    return yaml.safe_dump(config, sort_keys=False)


def seed_load(fleet: Fleet, *, leads: int, monitored: int) -> dict[str, Any]:
    """Put the backfill and the monitored leads in the store and the `leads` partitions, before start."""
    from dagster import DagsterInstance

    from assets.partitions import leads_partitions
    from investigations.intake.leads import normalize_lead
    from investigations.store import StateStore

    # Dagster's storage first, before any fleet process creates it concurrently.
    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    instance.get_runs(limit=1)
    store = StateStore.from_url(fleet.database_url)
    try:
        backfill = [normalize_lead("domain", f"backfill-{n:05d}.example") for n in range(leads)]
        watched = [normalize_lead("domain", f"monitored-{n:04d}.example") for n in range(monitored)]
        for lead in backfill:
            store.add_lead(lead)
        old = datetime.now(UTC) - timedelta(days=2)
        for lead in watched:
            store.add_lead(lead, case_id="case-bench-monitored", now=old)
            for source in RECURRING_SOURCES:
                store.complete_collection(source=source, lead_id=lead.id, outcome="ok", records=1, content_hash=None,
                                          path=None, run_id=None, now=old)
        instance.add_dynamic_partitions(leads_partitions.name, [lead.partition_key for lead in backfill + watched])
        queued = store.enqueue([(source, lead.id) for source in BACKFILL_SOURCES for lead in backfill],
                               origin="backfill:bench", priority_class="backfill")
    finally:
        store.close()
    return {"backfill_leads": leads, "backfill_sources": list(BACKFILL_SOURCES), "backfill_collections": queued,
            "monitored_leads": monitored, "recurring_sources": list(RECURRING_SOURCES),
            "recrawl_every_s": RECRAWL_EVERY_S}


# -- one mode -----------------------------------------------------------------------------------


def run_mode(mode: str, args: Any, offsets: Sequence[float], workdir: Path) -> dict[str, Any]:
    from investigations.demo.case import send_case
    from investigations.store import StateStore

    workspace = None if args.executor == "in_process" else workspace_yaml("defs_multiprocess")
    dagster_yaml = mode_dagster_yaml(mode, dequeue_interval_s=args.dequeue_interval_s, compute_logs=args.compute_logs,
                                     settings=args.dagster_settings)
    fleet = prepare_fleet(workdir / mode, dagster_yaml=dagster_yaml,
                          sources_yaml=bench_sources_yaml(args.source_settings), workspace_yaml=workspace,
                          watch_prefix=WATCH_PREFIX)
    load = seed_load(fleet, leads=args.leads, monitored=args.monitored)
    priority = "interactive" if mode == "priority" else "backfill"
    sent: list[dict[str, Any]] = []
    sampler: CpuSampler | None = None
    arrivals: dict[str, dict[str, float]] = {}
    sandbox_counts: dict[str, Any] = {}
    started_s = time.time()
    try:
        start_fleet(fleet)
        print(f"  [{mode}] fleet up in {time.time() - started_s:.0f} s (logs: {fleet.logs})", flush=True)
        sampler = CpuSampler({"dagster": fleet.procs["dagster"].pid, "intake": fleet.procs["intake"].pid,
                              "sandbox": fleet.procs["sandbox"].pid}).start()
        t0 = wait_first_request(fleet, URGENT_SOURCE, timeout_s=T0_TIMEOUT_S)
        print(f"  [{mode}] backfill reached the sandbox {t0 - started_s:.0f} s after start; "
              f"{len(offsets)} webhooks over the next {offsets[-1]:.0f} s, run ends at +{args.duration_s:.0f} s",
              flush=True)
        store = StateStore.from_url(fleet.database_url)
        try:
            for n, offset in enumerate(offsets):
                fleet.sleep_until(t0 + offset)
                value = f"{WATCH_PREFIX}{mode}-{n:02d}-{args.seed}.example"
                ahead = store.queue_depths().get(URGENT_SOURCE, {})
                body = {"case_id": f"case-bench-urgent-{mode}", "leads": [{"kind": "domain", "value": value}],
                        "sources": [URGENT_SOURCE], "priority": priority}
                sent_s = time.time()
                answer = send_case(fleet.intake_url, fleet.env["INVESTIGATIONS_WEBHOOK_SECRET"], body)
                accepted = answer.json().get("accepted", []) if answer.status_code == 202 else []
                sent.append({"n": n, "value": value, "lead_id": accepted[0] if accepted else None,
                             "sent_s": sent_s, "answered_s": time.time(), "status": answer.status_code,
                             "backlog_at_send": ahead})
        finally:
            store.close()
        end_s = t0 + args.duration_s
        fleet.sleep_until(end_s)
        with httpx.Client(trust_env=False, timeout=10) as client:
            arrivals = client.get(f"{fleet.sandbox_url}/_bench/arrivals").json()
            control = client.get(f"{fleet.sandbox_url}/_control").json()
            sandbox_counts = {name: entry["requests"] for name, entry in control["sources"].items()}
    finally:
        if sampler is not None:
            sampler.stop()
        fleet.stop()
    print(f"  [{mode}] stopped; reading the store and Dagster's run records", flush=True)
    cpu_window = (t0 + CPU_FROM * args.duration_s, end_s)
    figures = analyse_mode(fleet, sent, arrivals, t0=t0, end_s=end_s, cpu_window=cpu_window, sampler=sampler)
    return {"mode": mode, "webhook_priority": priority, "load": load, "t0": t0, "end_s": end_s,
            "sandbox_requests": sandbox_counts, "base_dir": str(fleet.base), **figures}


def wait_first_request(fleet: Fleet, source: str, *, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=5) as client:
        while time.monotonic() < deadline:
            fleet.check_alive()
            if client.get(f"{fleet.sandbox_url}/_control").json()["sources"][source]["requests"] > 0:
                return time.time()
            time.sleep(0.25)
    raise TimeoutError(f"no {source} request reached the sandbox within {timeout_s:.0f} s; see {fleet.logs}")


# -- figures ------------------------------------------------------------------------------------


def analyse_mode(fleet: Fleet, sent: list[dict[str, Any]], arrivals: dict[str, dict[str, float]], *, t0: float,
                 end_s: float, cpu_window: tuple[float, float], sampler: CpuSampler | None) -> dict[str, Any]:
    from dagster import DagsterEventType, DagsterInstance, RunsFilter
    from sqlalchemy import func, select

    from investigations.store import StateStore
    from investigations.store import schema as s

    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    store = StateStore.from_url(fleet.database_url)
    q = s.collection_queue
    webhooks = []
    try:
        for hook in sent:
            lead_id = hook["lead_id"]
            row: dict[str, Any] = {**hook, "first_request_s": None, "first_request_fetch_log_s": None,
                                   "stored_s": None, "stages": {}}
            if lead_id:
                row["first_request_s"] = arrivals.get(hook["value"], {}).get(URGENT_SOURCE)
                log = store.fetch_log(source=URGENT_SOURCE, lead_id=lead_id)
                if log:
                    row["first_request_fetch_log_s"] = min(epoch_s(r["at"]) - r["latency_ms"] / 1000 for r in log)
                coll = store.collection(URGENT_SOURCE, lead_id)
                row["stored_s"] = epoch_s(coll.last_success_at) if coll else None
                with store.engine.begin() as conn:
                    queued = conn.execute(select(q).where(q.c.source == URGENT_SOURCE, q.c.lead_id == lead_id)
                                          .order_by(q.c.id)).mappings().first()
                records = instance.get_run_records(RunsFilter(tags={"investigations/lead_id": lead_id}),
                                                   order_by="create_timestamp", ascending=True, limit=1)
                marks: dict[str, float | None] = {"sent": hook["sent_s"]}
                marks["queued"] = epoch_s(queued["enqueued_at"]) if queued else None
                marks["dispatched"] = epoch_s(queued["dispatched_at"]) if queued else None
                if records:
                    run = records[0]
                    row["run_id"] = run.dagster_run.run_id
                    marks["run created"] = epoch_s(run.create_timestamp)
                    kinds = {DagsterEventType.RUN_DEQUEUED, DagsterEventType.RUN_STARTING}
                    events = {e.dagster_event.event_type_value: e.timestamp
                              for e in instance.all_logs(run.dagster_run.run_id, of_type=kinds) if e.dagster_event}
                    marks["dequeued"] = events.get("PIPELINE_DEQUEUED", events.get("RUN_DEQUEUED",
                                                   events.get("PIPELINE_STARTING", events.get("RUN_STARTING"))))
                    marks["run started"] = epoch_s(run.start_time)
                marks["first request"] = row["first_request_s"]
                marks["stored"] = row["stored_s"]
                row["marks"] = marks
                for stage, _ in STAGES:
                    a, b = stage.split(" -> ")
                    if marks.get(a) is not None and marks.get(b) is not None and marks[b] <= end_s:
                        row["stages"][stage] = marks[b] - marks[a]
            webhooks.append(row)
        # Collections finished in the CPU window, per source (the fleet's useful work).
        lo, hi = (datetime.fromtimestamp(x, UTC) for x in cpu_window)
        with store.engine.begin() as conn:
            finished = (q.c.state == "done") & (q.c.finished_at >= lo) & (q.c.finished_at <= hi)
            done = dict(conn.execute(
                select(q.c.source, func.count()).where(finished, q.c.outcome.in_(["ok", "empty", "failed"]))
                .group_by(q.c.source)).all())
        runs = instance.get_run_records(RunsFilter(created_after=datetime.fromtimestamp(t0, UTC),
                                                   created_before=datetime.fromtimestamp(end_s, UTC)))
    finally:
        store.close()
    run_counts: dict[str, int] = {}
    for record in runs:
        klass = record.dagster_run.tags.get("investigations/priority_class", "other")
        key = f"{klass}/{record.dagster_run.status.value.lower()}"
        run_counts[key] = run_counts.get(key, 0) + 1
    latency = {"first_request": summarize(webhooks, "first_request_s", end_s),
               "stored": summarize(webhooks, "stored_s", end_s),
               "first_request_fetch_log": summarize(webhooks, "first_request_fetch_log_s", end_s)}
    stages = {stage: _median_p95([w["stages"][stage] for w in webhooks if stage in w["stages"]])
              for stage, _ in STAGES}
    cpu = sampler.window(*cpu_window) if sampler else {}
    return {"webhooks": webhooks, "latency_s": latency, "stages_s": stages, "runs_in_window": run_counts,
            "collections_in_cpu_window": done, "cpu_window": cpu,
            "backlog_at_send_median": statistics.median(
                [w["backlog_at_send"].get("ready", 0) for w in webhooks]) if webhooks else None}


def _median_p95(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50": None, "p95": None}
    ordered = sorted(values)
    return {"n": len(values), "p50": _rank(ordered, 0.50), "p95": _rank(ordered, 0.95)}


def _rank(ordered: Sequence[float], p: float) -> float:
    """Nearest rank: the ceil(p * n)-th smallest value."""
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def summarize(webhooks: list[dict[str, Any]], key: str, end_s: float) -> dict[str, Any]:
    """p50, p95, max of `key - sent_s`; an unfinished lead counts with `end - sent` as a lower bound.

    Nearest rank over the known values and the lower bounds; a percentile is exact only when it is a
    known value and no unfinished lead's bound lies below it, otherwise it is shown as a lower bound.
    """
    values: list[tuple[float, bool]] = []  # (seconds, exact)
    for hook in webhooks:
        done = hook.get(key)
        if done is not None and done <= end_s:
            values.append((done - hook["sent_s"], True))
        else:
            values.append((end_s - hook["sent_s"], False))
    if not values:
        return {"n": 0, "unfinished": 0, "p50": None, "p95": None, "max": None}
    ordered = sorted(values)

    def cell(p: float) -> dict[str, Any]:
        seconds, exact = ordered[max(0, math.ceil(p * len(ordered)) - 1)]
        # An unfinished lead ranked below this value may truly lie above it: then this is a lower bound too.
        exact = exact and not any(not done and bound < seconds for bound, done in values)
        return {"s": seconds, "lower_bound": not exact}

    return {"n": len(values), "unfinished": sum(not exact for _, exact in values),
            "p50": cell(0.50), "p95": cell(0.95), "max": cell(1.0)}


def cpu_figures(mode: dict[str, Any], engine: dict[str, Any] | None) -> dict[str, Any]:
    window = mode["cpu_window"]
    groups = window.get("groups", {})
    collections = sum(mode["collections_in_cpu_window"].values())
    fleet_cpu = groups.get("dagster", 0.0) + groups.get("intake", 0.0)
    seconds = window.get("seconds") or None
    processes = window.get("processes", {})
    roles = window.get("roles", {})
    workers = processes.get("dagster/run worker", 0)
    run_cpu = roles.get("dagster/run worker", 0.0) + roles.get("dagster/run log capture", 0.0)
    per_run = run_cpu / workers if workers else None
    machine = window.get("machine_busy_s")
    others = machine - fleet_cpu - groups.get("sandbox", 0.0) - window.get("bench_s", 0.0) if machine else None
    out: dict[str, Any] = {
        "machine_cores_busy": machine / seconds if machine and seconds else None,
        "other_processes_cores": others / seconds if others is not None and seconds else None,
        "bench_cpu_s": window.get("bench_s"),
        "run_worker_processes": workers, "cpu_per_run_worker_s": per_run,
        "processes_seen": processes,
        "window_s": window.get("seconds"), "collections": collections,
        "collections_per_s": collections / window["seconds"] if window.get("seconds") else None,
        "dagster_cpu_s": groups.get("dagster"), "intake_cpu_s": groups.get("intake"),
        "sandbox_cpu_s": groups.get("sandbox"), "fleet_cpu_s": fleet_cpu,
        "fleet_cores": fleet_cpu / window["seconds"] if window.get("seconds") else None,
        "fleet_cpu_per_collection_s": fleet_cpu / collections if collections else None,
        "roles_cpu_s": window.get("roles", {}),
    }
    engine_per = engine.get("cpu_per_collection_s") if engine else None
    out["engine_cpu_per_collection_s"] = engine_per
    if engine_per is not None and out["fleet_cpu_per_collection_s"]:
        out["dagster_share"] = 1 - engine_per / out["fleet_cpu_per_collection_s"]
    else:
        out["dagster_share"] = None
    return out


# -- the engine alone ---------------------------------------------------------------------------


def run_engine_phase(mix: dict[str, int], args: Any, workdir: Path) -> dict[str, Any]:
    """The same mix of collections, scaled to `--engine-leads`, by the engine alone in one process."""
    from investigations.store import StateStore

    total = sum(mix.values())
    scale = min(1.0, args.engine_leads / total) if total else 0.0
    plan = {source: max(1, round(count * scale)) for source, count in mix.items() if count}
    fleet = prepare_fleet(workdir / "engine", dagster_yaml="", sources_yaml=bench_sources_yaml(args.source_settings))
    StateStore.from_url(fleet.database_url).close()  # migrate before the worker starts
    sampler: CpuSampler | None = None
    proc, out = None, fleet.logs / "engine.json"
    try:
        start_fleet(fleet, services=("sandbox",))
        proc, out = engine_subprocess(plan, env=fleet.env, deadline_s=time.time() + ENGINE_TIMEOUT_S, seed=args.seed,
                                      log=fleet.logs / "engine.log")
        fleet.procs["engine"] = proc
        sampler = CpuSampler({"engine": proc.pid, "sandbox": fleet.procs["sandbox"].pid}).start()
        proc.wait(timeout=ENGINE_TIMEOUT_S + 120)
    finally:
        if sampler is not None:
            sampler.stop()
        fleet.stop()
    if proc is None or proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"engine process failed ({proc and proc.returncode}); see {fleet.logs / 'engine.log'}")
    result = json.loads(out.read_text())
    collected = sum(result["collected"].values())
    whole = sampler.window(0, time.time()) if sampler else {}
    result.update({
        "collections": collected,
        "cpu_per_collection_s": result["cpu_s"] / collected if collected else None,
        "sandbox_cpu_s": whole.get("groups", {}).get("sandbox"),
        "process_cpu_s_with_startup": whole.get("groups", {}).get("engine"),
    })
    return result


# -- the report ---------------------------------------------------------------------------------


def _lat(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f">{cell['s']:.1f}" if cell["lower_bound"] else f"{cell['s']:.1f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(figures: dict[str, Any]) -> None:
    modes = figures["modes"]
    names = list(modes)
    cfg = figures["config"]
    if cfg.get("dagster_set") or cfg.get("sources_set"):
        print(f"\nsettings changed for this run: dagster.yaml {cfg.get('dagster_set') or {}}, "
              f"sources {cfg.get('sources_set') or {}}")
    rows: list[list[Any]] = []
    for key, label in (("first_request", "webhook -> first request at sandbox"),
                       ("stored", "webhook -> records stored")):
        for stat in ("p50", "p95", "max"):
            rows.append([f"{label} {stat} (s)", *(_lat(modes[m]["latency_s"][key][stat]) for m in names)])
        counts = {m: modes[m]["latency_s"][key] for m in names}
        rows.append([f"{label}: unfinished at end", *(f"{counts[m]['unfinished']}/{counts[m]['n']}" for m in names)])
    rows.append(["cross-check: first request from fetch log p50/p95 (s)",
                 *(f"{_lat(modes[m]['latency_s']['first_request_fetch_log']['p50'])}/"
                   f"{_lat(modes[m]['latency_s']['first_request_fetch_log']['p95'])}" for m in names)])
    rows.append([f"{URGENT_SOURCE} backlog ready at send (median)",
                 *(_num(modes[m]["backlog_at_send_median"], 0) for m in names)])
    rows.append([f"goal p95 first request <= {GOAL_P95_FIRST_S:g} s",
                 *(("met" if _goal_latency(modes[m]) else "NOT met") for m in names)])
    print_table(f"Urgent latency: {cfg['webhooks']} webhooks to {URGENT_SOURCE} during a {cfg['leads']}-lead "
                f"backfill "
                f"({'+'.join(BACKFILL_SOURCES)}) and recurring crawls ({'+'.join(RECURRING_SOURCES)}); "
                f"{cfg['duration_s']:g} s per mode, dequeue interval {cfg['dequeue_interval_s']} s, "
                f"{cfg['executor']} executor, {cfg['compute_logs']} compute logs", ["", *names], rows)

    stage_rows = [[f"{stage} p50/p95 (n)", *(_stage(modes[m]["stages_s"][stage]) for m in names)]
                  for stage, _ in STAGES]
    print_table("Where the time goes, per webhook (s; only stages that ended within the run)", ["", *names],
                stage_rows)

    cpu_rows: list[list[Any]] = []
    cpus = {m: modes[m]["cpu"] for m in names}
    for label, key, digits in (("CPU window (s)", "window_s", 0), ("collections finished in it", "collections", 0),
                               ("collections / s", "collections_per_s", 2),
                               ("Dagster processes CPU (s)", "dagster_cpu_s", 1),
                               ("intake CPU (s)", "intake_cpu_s", 1), ("fleet CPU, cores busy", "fleet_cores", 2),
                               ("sandbox (the web) CPU (s)", "sandbox_cpu_s", 1),
                               ("whole machine, cores busy (of 2)", "machine_cores_busy", 2),
                               ("  of which other users' processes", "other_processes_cores", 2),
                               ("run worker processes seen", "run_worker_processes", 0),
                               ("CPU per run worker, with its log capture (s)", "cpu_per_run_worker_s", 2),
                               ("fleet CPU per collection (ms)", "fleet_cpu_per_collection_s", None),
                               ("engine alone CPU per collection (ms)", "engine_cpu_per_collection_s", None)):
        if digits is None:
            cpu_rows.append([label, *(_num(None if cpus[m][key] is None else cpus[m][key] * 1000, 1) for m in names)])
        else:
            cpu_rows.append([label, *(_num(cpus[m][key], digits) for m in names)])
    cpu_rows.append(["Dagster share = 1 - engine/fleet",
                     *("-" if cpus[m]["dagster_share"] is None else f"{cpus[m]['dagster_share']:.1%}"
                       for m in names)])
    cpu_rows.append([f"goal Dagster share <= {GOAL_DAGSTER_SHARE:.0%}",
                     *("-" if cpus[m]["dagster_share"] is None else
                       ("met" if cpus[m]["dagster_share"] <= GOAL_DAGSTER_SHARE else "NOT met") for m in names)])
    roles = sorted({r for m in names for r in cpus[m]["roles_cpu_s"]})
    for role in roles:
        cpu_rows.append([f"  {role} (s)", *(_num(cpus[m]["roles_cpu_s"].get(role), 1) for m in names)])
    print_table("CPU while the backfill runs (fleet = every process under `dagster dev` + intake; sandbox apart)",
                ["", *names], cpu_rows)
    engine = figures.get("engine")
    if engine:
        print(f"\n  engine alone: {engine['collections']} collections {engine['collected']} "
              f"in {engine['wall_s']:.0f} s, "
              f"{engine['cpu_s']:.1f} CPU s (collection phase; {_num(engine['process_cpu_s_with_startup'])} s with "
              f"imports), sandbox {_num(engine['sandbox_cpu_s'])} CPU s")
    runs = {m: modes[m]["runs_in_window"] for m in names}
    for m in names:
        print(f"  runs created during the {m} run: {json.dumps(runs[m], sort_keys=True)}")
    print("\n  First request: stamped by the sandbox when the request for the lead arrives (the fetch log's "
          "`at - latency_ms` is the cross-check). Percentiles are nearest rank; `>x`: the lead was not reached "
          "by the end of the run, x is a lower bound.")
    print("  Dagster share: the fleet's CPU (all of dagster dev's processes and the intake) per finished "
          "collection, against the CPU per collection of the same work done by the engine in one plain "
          "process; what is left is the price of running it under Dagster.")


def _stage(entry: dict[str, Any]) -> str:
    if not entry["n"]:
        return "-"
    return f"{entry['p50']:.1f}/{entry['p95']:.1f} ({entry['n']})"


def _goal_latency(mode: dict[str, Any]) -> bool:
    p95 = mode["latency_s"]["first_request"]["p95"]
    return bool(p95) and not p95["lower_bound"] and p95["s"] <= GOAL_P95_FIRST_S


# -- main ---------------------------------------------------------------------------------------


def _extra(parser: Any) -> None:
    parser.add_argument("--leads", type=int, default=DEFAULT_LEADS, help=f"backfill leads (default {DEFAULT_LEADS})")
    parser.add_argument("--webhooks", type=int, default=DEFAULT_WEBHOOKS, help=f"urgent webhooks per mode "
                        f"(default {DEFAULT_WEBHOOKS})")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: priority, fifo (default both)")
    parser.add_argument("--monitored", type=int, default=DEFAULT_MONITORED,
                        help=f"leads due a recurring crawl on {'+'.join(RECURRING_SOURCES)} "
                        f"(default {DEFAULT_MONITORED})")
    parser.add_argument("--engine-leads", type=int, default=DEFAULT_ENGINE_LEADS,
                        help=f"collections of the engine-alone measurement (default {DEFAULT_ENGINE_LEADS}; "
                        "0 skips it)")
    parser.add_argument("--dequeue-interval-s", type=int, default=None,
                        help="override dagster.yaml's run_queue.dequeue_interval_seconds (default: the repo's)")
    parser.add_argument("--executor", choices=["in_process", "multiprocess"], default="in_process",
                        help="the fleet's executor (default in_process, as definitions.py)")
    parser.add_argument("--compute-logs", choices=["local", "noop"], default="local",
                        help="local: Dagster's default (a tail + watcher per run); noop: NoOpComputeLogManager")
    parser.add_argument("--dagster-set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a dagster.yaml setting for every mode, e.g. sensors.use_threads=true "
                        "(repeatable; the value is YAML)")
    parser.add_argument("--sources-set", action="append", default=[], metavar="SOURCE.KEY=VALUE",
                        help="override a source's setting, e.g. robust.max_in_flight=100 or *.batch_max_leads=100 "
                        "(repeatable)")
    parser.add_argument("--label", default=None,
                        help="results file suffix for a variant (default: made from the options)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, stores) after the run")


def results_name(args: Any, config: dict[str, Any]) -> str:
    """`urgent` for the repo's settings; `urgent-<variant>` when the run changed any of them."""
    parts = []
    if args.dequeue_interval_s is not None:
        parts.append(f"dequeue{args.dequeue_interval_s}s")
    if args.executor != "in_process":
        parts.append(args.executor)
    if args.compute_logs != "local":
        parts.append(f"{args.compute_logs}-logs")
    parts += [f"{k}={v}" for k, v in args.dagster_settings + args.source_settings]
    if args.label:
        parts = [args.label]
    slug = "-".join(parts).replace("*", "all").replace("/", "_").replace(" ", "")
    return f"{NAME}-{slug}" if slug else NAME


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, description=__doc__.splitlines()[0], default_duration_s=DEFAULT_DURATION_S, extra=_extra)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    try:
        args.dagster_settings = parse_settings(args.dagster_set)
        args.source_settings = parse_settings(args.sources_set)
    except ValueError as exc:
        print(f"--dagster-set/--sources-set: {exc}", file=sys.stderr)
        return 2
    if not modes or any(m not in MODES for m in modes):
        print(f"--modes: pick from {', '.join(MODES)}", file=sys.stderr)
        return 2
    # SIGTERM ends the bench through its `finally` blocks, so no fleet process outlives it.
    signal.signal(signal.SIGTERM, _interrupt)
    rng = random.Random(args.seed)
    offsets = sorted(rng.uniform(SEND_FROM, SEND_UNTIL) * args.duration_s for _ in range(args.webhooks))
    repo_dequeue = (yaml.safe_load((ROOT / "dagster.yaml").read_text()).get("run_queue") or {}).get(
        "dequeue_interval_seconds", 5)
    config = {"leads": args.leads, "webhooks": args.webhooks, "duration_s": args.duration_s, "modes": modes,
              "monitored": args.monitored, "seed": args.seed, "executor": args.executor,
              "dequeue_interval_s": args.dequeue_interval_s if args.dequeue_interval_s is not None else repo_dequeue,
              "send_offsets_s": offsets, "engine_leads": args.engine_leads, "compute_logs": args.compute_logs,
              "dagster_set": dict(args.dagster_settings), "sources_set": dict(args.source_settings)}
    figures: dict[str, Any] = {"config": config, "modes": {}, "engine": None}
    workdir = Path(tempfile.mkdtemp(prefix="bench-urgent-"))
    try:
        for mode in modes:
            print(f"\n--- mode {mode} ---", flush=True)
            figures["modes"][mode] = run_mode(mode, args, offsets, workdir)
        reference = figures["modes"].get("priority") or next(iter(figures["modes"].values()))
        if args.engine_leads > 0 and reference["collections_in_cpu_window"]:
            print("\n--- the engine alone ---", flush=True)
            figures["engine"] = run_engine_phase(reference["collections_in_cpu_window"], args, workdir)
        for mode in figures["modes"].values():
            mode["cpu"] = cpu_figures(mode, figures["engine"])
        figures["goals"] = {
            "p95_first_request_s": GOAL_P95_FIRST_S, "dagster_share": GOAL_DAGSTER_SHARE,
            "met": {m: {"latency": _goal_latency(v), "dagster_share": v["cpu"]["dagster_share"] is not None
                        and v["cpu"]["dagster_share"] <= GOAL_DAGSTER_SHARE} for m, v in figures["modes"].items()},
        }
        report(figures)
        path = write_results(results_name(args, config), figures, args.results_dir)
        print(f"\nfigures: {path}")
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"temp dirs kept: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
