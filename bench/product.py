"""The product path at the ceiling: leads a user adds, backfilled in batches, against a real limiter.

For each configuration a fleet is started on loopback as a deployment runs it (docs/deploying.md):
the project's code server as a service of its own (`dagster code-server start`: sensors, and the run
workers as its children), `dagster-daemon` on `deploy/workspace.yaml` (run queue, sensor ticks), the
webhook intake and the sandbox web, in temp dirs with free ports (`bench.fleet_process`). In front
of the sandbox's `robust` route stands nginx `limit_req` with two zones, per client address and
site-wide, both answering 429; in front of nginx, one tinyproxy per identity, each sending from its
own 127.0.0.x (`bench.proxies`), so nginx sees one client per identity. The fleet's identities file
lists the proxies; `robust` is pointed at nginx. The ceiling is min(site rate, identities x
per-address rate).

Then the user's steps, with the CLI: `investigations leads add --file leads.txt --case ...` (the
case stays active, so recurring crawls stay on), `investigations backfill --source robust`. t0 is
the first request nginx logs; the run lasts `--duration-s` from there.

Configurations (one bench run, one after the other, each with a fresh fleet, nginx and proxies):
- `right`: the source configured to the limiter (rates as nginx's, bursts one below nginx's, as the
  docs/configuration.md says); goal OK/s / ceiling >= 0.97 over the whole window and 0 refusals.
- `high`: the source configured at twice the limiter's rates and bursts; AIMD must bring it down
  (nginx sends no Retry-After); goal >= 0.90 of the ceiling over the whole window, the second half
  at least 0.97 x the first (no decay), and at most 1 % refused after the first 30 s.
- `high4`: configured at four times the limiter's rates and bursts; goal >= 0.85 of the ceiling over
  the whole window and at most 2 % refused after the first 60 s.
- `defend`: configured right, against a target that defends itself: nginx passes its refusals on
  to the sandbox, which bans an address (403 and a captcha page, for `ban_s`) after DEFEND's
  `ban_refusals` refusals within `ban_window_s`, or when its last `ban_rhythm_gaps` gaps vary less
  than `ban_rhythm_cv`; goal 0 identities banned and >= 0.97 of the ceiling.
- `engine`: the engine alone (one process: `Collector` + `Fetcher` + rate lanes + the identity pool,
  no Dagster, one batch's `concurrency` threads) on the same target configured right, for its CPU
  per stored record and the rate it reaches.

The defaults are the issue's setting: 8 identities, nginx at 5 r/s per address (burst 2) and 30 r/s
site-wide (burst 5), 10 minutes per configuration. Figures come from nginx's own access log (OK/s /
ceiling after 30 s and over the whole window, the second half against the first, a per-minute
table, 429s, refused share after 30 s and after 60 s, gap CV per client address), Dagster's run records (runs by kind, leads per run, start-up and wind-down of each
run) and the fleet's state store (records stored, parked collections and their reasons). CPU per
stored record: every fleet process (daemon, code server, run workers, intake) sampled from /proc over
the steady window, over the collections stored in it; the engine's own CPU over its collections.
"""

from __future__ import annotations

import json
import math
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import (
    ToolMissing,
    bench_workdir,
    dagster_postgres_storage,
    engine_digest,
    epoch_s,
    fmt,
    fresh_databases,
    gap_cv,
    host_load,
    parse_args,
    pg_server_pid,
    pg_url,
    print_table,
    write_results,
)
from bench.fleet_process import BIN, ROOT, CpuSampler, Fleet, engine_subprocess, prepare_fleet, start_fleet
from bench.nginx import Limiter, Nginx
from bench.proxies import Proxies
from investigations.demo.fleet import stop_all

NAME = "product"
SOURCE = "robust"
CASE_ID = "case-bench-product"
DEFAULT_DURATION_S = 600.0
DEFAULT_ENGINE_S = 60.0
DEFAULT_IDENTITIES = 8
DEFAULT_CLIENT_RATE = 5  # nginx per-address zone, r/s
DEFAULT_SITE_RATE = 30  # nginx site-wide zone, r/s
DEFAULT_BURST = 2  # the per-address zone's burst (nodelay)
DEFAULT_SITE_BURST = 5  # the site-wide zone's burst (nodelay)
WARMUP_S = 30.0  # the refused share and the steady rate are read after this
FIRST_MINUTE_S = 60.0
TIMELINE_BIN_S = 30.0
MINUTE_S = 60.0  # the per-minute table's bins
LEADS_MARGIN = 1.3  # leads added per config: the ceiling's worth of the run, and this much more
T0_TIMEOUT_S = 180.0  # from the backfill command to the first request at nginx
GOAL_RATIO = 0.97
GOAL_CPU_FACTOR = 2.5
HIGH_FACTOR = 2
GOAL_HIGH_REFUSED_SHARE = 0.01
GOAL_HIGH_RATIO = 0.90
GOAL_NO_DECAY = 0.97  # high: the second half's OK/s at least this x the first half's
HIGH4_FACTOR = 4
GOAL_HIGH4_REFUSED_SHARE = 0.02
HIGH4_WARMUP_S = 60.0  # high4's refused share is read after this
GOAL_HIGH4_RATIO = 0.85
# The defending target's rules (the sandbox's settings for the source's route): a few refusals in a
# short window, or a too regular rhythm, and the address is banned for a minute.
DEFEND = {"ban_refusals": 3, "ban_window_s": 10.0, "ban_rhythm_cv": 0.1, "ban_rhythm_gaps": 8, "ban_s": 60.0}
NO_REASON = "(no reason)"
REFUSAL_CONTEXT_S = 1.5  # per refusal, the requests nginx logged this long before it
REFUSALS_SHOWN = 8


@dataclass(frozen=True)
class Config:
    name: str
    duration_s: float
    rate_factor: float  # the fleet's configured rates / nginx's
    postgres: bool = False  # the state store and Dagster's storage on Postgres (fresh databases, dropped after)
    defend: bool = False  # the target bans addresses (DEFEND)


# -- set-up --------------------------------------------------------------------------------------


def sources_yaml(nginx_url: str, args: Any, factor: float) -> str:
    """The repo's sources, `robust` pointed at nginx and configured at `factor` x the limiter's rates."""
    config = yaml.safe_load((ROOT / "sources.yaml").read_text())
    for entry in config["sources"]:
        if entry["name"] == SOURCE:
            entry["request"]["url"] = f"{nginx_url}/robust/api/lookup?kind={{kind}}&q={{value}}"
            entry["rate"] = {"source_per_s": args.site_rate * factor,
                             "source_burst": lane_burst(site_burst(args), factor),
                             "identity_per_s": args.client_rate * factor,
                             "identity_burst": lane_burst(args.burst, factor)}
    return yaml.safe_dump(config, sort_keys=False)


def identities_yaml(proxies: Proxies) -> str:
    """One identity per proxy, each its own range (a rest of one never rests the others)."""
    return yaml.safe_dump({
        "tiers": ["datacenter"],
        "identities": [{"id": f"proxy{n}", "proxy_url": url, "range": f"range{n}", "tier": "datacenter"}
                       for n, url in enumerate(proxies.urls)],
    }, sort_keys=False)


def lane_burst(nginx_burst: int, factor: float) -> int:
    """The fleet's burst for a zone of nginx's: one below it when configured right (the lanes allow
    one request above the permitted count in a window); configured too high, the burst is as wrong
    as the rate (`factor` x nginx's), as an operator who read the source's limits wrong would set both."""
    return max(1, nginx_burst - 1) if factor <= 1 else math.ceil(nginx_burst * factor)


def site_burst(args: Any) -> int:
    """The site-wide zone's burst: `--site-burst`; the per-address zone's for a caller that sets one
    burst for both (bench.case)."""
    return int(getattr(args, "site_burst", None) or args.burst)


def ceiling_per_s(args: Any) -> float:
    return float(min(args.site_rate, args.identities * args.client_rate))


def run_cli(fleet: Fleet, *argv: str) -> dict[str, Any]:
    """One `investigations` command as a user runs it, in the fleet's environment: its wall and CPU time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    done = subprocess.run([str(BIN / "investigations"), *argv], env=fleet.env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"investigations {' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return {"command": "investigations " + " ".join(argv), "output": done.stdout.strip()[-300:],
            "wall_s": time.time() - started,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def wait_first_row(nginx: Nginx, name: str, fleet: Fleet, *, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fleet.check_alive()
        rows = nginx.log_rows(name)
        if rows:
            return rows[0][0]
        time.sleep(0.25)
    raise TimeoutError(f"no request reached nginx within {timeout_s:.0f} s; see {fleet.logs}")


def _limiter(name: str, args: Any, *, defend: bool = False) -> Limiter:
    return Limiter(name, args.client_rate, args.burst, site_rate_per_s=args.site_rate, site_burst=site_burst(args),
                   pass_refusals=defend)


def sandbox_source(fleet: Fleet, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sandbox's settings and counters for the source's route, after `changes` if any."""
    with httpx.Client(trust_env=False, timeout=5.0) as client:
        if changes:
            client.post(f"{fleet.sandbox_url}/_control/{SOURCE}", json=changes).raise_for_status()
        answer = client.get(f"{fleet.sandbox_url}/_control")
        answer.raise_for_status()
        return dict(answer.json()["sources"][SOURCE])


def ban_figures(state: dict[str, Any], outgoing: dict[str, str]) -> dict[str, Any]:
    """The target's bans per identity (the sandbox sees each proxy's outgoing address)."""
    bans = {outgoing.get(address, address): n for address, n in state["bans"].items()}
    cvs = [cv for address, cv in state["lowest_rhythm_cv"].items() if address in outgoing]
    return {"identities_banned": len(bans), "bans": sum(bans.values()), "per_identity": bans,
            "reasons": state["ban_reasons"], "lowest_8_gap_cv": min(cvs) if cvs else None}


# -- one fleet configuration ---------------------------------------------------------------------


def run_config(cfg: Config, args: Any, workdir: Path) -> dict[str, Any]:
    """One configuration measured; on Postgres, in fresh databases dropped afterwards."""
    with fresh_databases("product", wanted=cfg.postgres) as databases:
        return measure_config(cfg, args, workdir, databases)


def measure_config(cfg: Config, args: Any, workdir: Path, databases: Sequence[str]) -> dict[str, Any]:
    from dagster import DagsterInstance

    leads = math.ceil(ceiling_per_s(args) * cfg.duration_s * LEADS_MARGIN) + 50
    dagster_yaml = (ROOT / "dagster.yaml").read_text()
    if databases:
        dagster_yaml += "\n" + yaml.safe_dump({"storage": dagster_postgres_storage(databases[1])}, sort_keys=False)
    fleet = prepare_fleet(workdir / cfg.name, dagster_yaml=dagster_yaml, sources_yaml="")
    if databases:
        fleet.database_url = fleet.env["INVESTIGATIONS_DATABASE_URL"] = pg_url(databases[0])
    sampler: CpuSampler | None = None
    cli: list[dict[str, Any]] = []
    try:
        start_fleet(fleet, services=("sandbox",))
        sandbox_port = fleet.env["INVESTIGATIONS_SANDBOX_PORT"]
        if cfg.defend:
            sandbox_source(fleet, DEFEND)
        with Nginx([_limiter(cfg.name, args, defend=cfg.defend)], upstream=f"127.0.0.1:{sandbox_port}") as nginx, \
                Proxies(args.identities) as proxies:
            (fleet.base / "sources.yaml").write_text(sources_yaml(nginx.url(cfg.name), args, cfg.rate_factor))
            (fleet.base / "identities.yaml").write_text(identities_yaml(proxies))
            fleet.env["INVESTIGATIONS_IDENTITIES"] = str(fleet.base / "identities.yaml")
            # Dagster's storage first, before the fleet's processes create it concurrently.
            DagsterInstance.from_config(str(fleet.dagster_home)).get_runs(limit=1)
            leads_file = fleet.base / "leads.txt"
            leads_file.write_text("".join(f"domain product-{cfg.name}-{n:05d}.example\n" for n in range(leads)))
            cli.append(run_cli(fleet, "leads", "add", "--file", str(leads_file), "--case", CASE_ID))
            started_s = time.time()
            fleet.env["BENCH_WORKSPACE"] = str(ROOT / "deploy" / "workspace.yaml")
            start_fleet(fleet, services=("code-server", "intake", "daemon"))
            groups = {"dagster": (fleet.procs["daemon"].pid, fleet.procs["code-server"].pid),
                      "intake": fleet.procs["intake"].pid,
                      "sandbox": fleet.procs["sandbox"].pid, "nginx": nginx._proc.pid if nginx._proc else 0}
            groups.update({f"proxy{n}": proc.pid for n, proc in enumerate(proxies.procs)})
            if databases and (server := pg_server_pid()):
                # The database server's work for the fleet (Dagster's storage and the state store).
                groups["postgres"] = server
            sampler = CpuSampler(groups).start()
            cli.append(run_cli(fleet, "backfill", "--source", SOURCE))
            t0 = wait_first_row(nginx, cfg.name, fleet, timeout_s=T0_TIMEOUT_S)
            print(f"  [{cfg.name}] first request at nginx {t0 - started_s:.0f} s after the services started; "
                  f"running {cfg.duration_s:.0f} s (logs: {fleet.logs})", flush=True)
            end_s = t0 + cfg.duration_s
            fleet.sleep_until(end_s)
            sampler.stop()
            # Dagster first: a run still collecting while the sandbox goes would log its 502s as failures.
            stop_all([fleet.procs.pop(name) for name in ("daemon", "code-server", "intake")])
            target = sandbox_source(fleet)
            fleet.stop()
            rows = nginx.client_rows(cfg.name)
            zones = nginx.refusals_by_zone(cfg.name)
            outgoing = dict(zip(proxies.outgoing, (f"proxy{n}" for n in range(args.identities)), strict=True))
    finally:
        if sampler is not None:
            sampler.stop()
        fleet.stop()
    print(f"  [{cfg.name}] stopped; reading nginx's log, Dagster's run records and the store", flush=True)
    figures = limiter_figures(rows, t0=t0, end_s=end_s, ceiling=ceiling_per_s(args), outgoing=outgoing)
    steady = (t0 + WARMUP_S, end_s)
    fleet_figures = analyse_fleet(fleet, t0=t0, end_s=end_s, steady=steady)
    cpu = sampler.window(*steady) if sampler else {}
    stored = fleet_figures["stored_in_steady_window"]
    fleet_cpu = sum(cpu.get("groups", {}).get(g, 0.0) for g in ("dagster", "intake"))
    return {"config": cfg.name, "rate_factor": cfg.rate_factor, "postgres": cfg.postgres, "defend": cfg.defend,
            "leads_added": leads, "cli": cli, "t0": t0, "end_s": end_s, **figures, **fleet_figures,
            "refused_by_zone": zones,
            "target_bans": ban_figures(target, outgoing),
            "cpu": {"window_s": cpu.get("seconds"), "fleet_cpu_s": fleet_cpu, "groups_s": cpu.get("groups", {}),
                    "roles_s": cpu.get("roles", {}), "processes": cpu.get("processes", {}),
                    "machine_cores_busy": cpu["machine_busy_s"] / cpu["seconds"] if cpu.get("seconds") else None,
                    "fleet_cpu_per_record_s": fleet_cpu / stored if stored else None,
                    "postgres_cpu_per_record_s": (cpu["groups"]["postgres"] / stored
                                                  if stored and "postgres" in cpu.get("groups", {}) else None)}}


def per_second(rows: Sequence[tuple[float, int, str]], *, t0: float, end_s: float) -> list[int]:
    """OK answers in each whole second from t0 (the last, partial second included)."""
    counts = [0] * max(0, math.ceil(end_s - t0))
    for at, status, _ in rows:
        if 200 <= status < 300 and t0 <= at < end_s:
            counts[int(at - t0)] += 1
    return counts


def limiter_figures(rows: Sequence[tuple[float, int, str]], *, t0: float, end_s: float, ceiling: float,
                    outgoing: dict[str, str]) -> dict[str, Any]:
    """What nginx saw: rates against the ceiling, 429s, and per client address its gaps."""
    inside = [r for r in rows if t0 <= r[0] < end_s]
    steady = [r for r in inside if r[0] >= t0 + WARMUP_S]
    first_minute = [r for r in inside if r[0] < t0 + FIRST_MINUTE_S]
    steady_s = end_s - t0 - WARMUP_S

    def ok(picked: Sequence[tuple[float, int, str]]) -> int:
        return sum(1 for r in picked if 200 <= r[1] < 300)

    def refused(picked: Sequence[tuple[float, int, str]]) -> int:
        return sum(1 for r in picked if r[1] == 429)

    clients = {}
    for address in sorted({r[2] for r in inside}):
        mine = [r for r in steady if r[2] == address]
        clients[outgoing.get(address, address)] = {
            "address": address, "requests": len(mine), "ok": ok(mine), "refused_429": refused(mine),
            "ok_per_s": ok(mine) / steady_s if steady_s > 0 else None, "gap_cv": gap_cv([r[0] for r in mine])}
    def bins(width_s: float) -> list[dict[str, Any]]:
        out, at = [], t0
        while at < end_s:
            upto = min(at + width_s, end_s)
            picked = [r for r in inside if at <= r[0] < upto]
            out.append({"from_s": round(at - t0), "ok_per_s": ok(picked) / (upto - at),
                        "ratio": ok(picked) / (upto - at) / ceiling, "refused_429": refused(picked)})
            at = upto
        return out

    ok_per_s = ok(steady) / steady_s if steady_s > 0 else None
    window_s = end_s - t0
    half = t0 + window_s / 2
    first_half, second_half = ok([r for r in inside if r[0] < half]), ok([r for r in inside if r[0] >= half])
    after_minute = [r for r in inside if r[0] >= t0 + HIGH4_WARMUP_S]
    # What reached nginx just before each refusal (the first few): a burst, and from whom.
    context = [{"at_s": round(at - t0, 2), "client": outgoing.get(address, address),
                "before": [[round(r[0] - at, 3), r[1], outgoing.get(r[2], r[2])] for r in inside
                           if at - REFUSAL_CONTEXT_S <= r[0] < at]}
               for at, status, address in inside if status == 429][:REFUSALS_SHOWN]
    return {
        "ceiling_per_s": ceiling,
        "ok_per_s": ok_per_s,
        "ratio": ok_per_s / ceiling if ok_per_s is not None else None,
        # The whole window, the ramp included: what the issue of pacing calls "over the whole window".
        "window_ratio": ok(inside) / window_s / ceiling if window_s > 0 else None,
        # Decay: the second half's OK/s over the first half's (1 = as fast at the end as at the start).
        "halves_ratio": second_half / first_half if first_half else None,
        "first_minute_ratio": ok(first_minute) / min(FIRST_MINUTE_S, end_s - t0) / ceiling,
        "requests": len(inside), "ok": ok(inside), "refused_429": refused(inside),
        "refused_429_after_warmup": refused(steady),
        "refused_share_after_warmup": refused(steady) / len(steady) if steady else None,
        "refused_share_after_minute": refused(after_minute) / len(after_minute) if after_minute else None,
        "other_statuses": dict(Counter(str(r[1]) for r in inside if not (200 <= r[1] < 300 or r[1] == 429))),
        "clients": clients, "timeline": bins(TIMELINE_BIN_S), "per_minute": bins(MINUTE_S),
        # OK answers per second of the window, to line dips up with the runs' starts and ends.
        "ok_per_second": per_second(inside, t0=t0, end_s=end_s),
        "refusal_context": context,
    }


def analyse_fleet(fleet: Fleet, *, t0: float, end_s: float, steady: tuple[float, float]) -> dict[str, Any]:
    """Dagster's runs (kinds, leads, start-up, wind-down, events per lead) and the store's outcomes."""
    from dagster import DagsterInstance
    from sqlalchemy import func, or_, select

    from investigations.store import StateStore
    from investigations.store import schema as s

    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    store = StateStore.from_url(fleet.database_url)
    q, log = s.collection_queue, s.fetch_log
    try:
        with store.engine.begin() as conn:
            lo, hi = (datetime.fromtimestamp(x, UTC) for x in steady)
            stored = conn.execute(select(func.count()).where(
                q.c.source == SOURCE, q.c.state == "done", q.c.outcome.in_(["ok", "empty"]),
                q.c.finished_at >= lo, q.c.finished_at < hi)).scalar_one()
            # Every source's collections stored in the window: the recurring crawls of the others run
            # in the same fleet, on the same CPU.
            stored_by_source = dict(conn.execute(select(q.c.source, func.count()).where(
                q.c.state == "done", q.c.outcome.in_(["ok", "empty"]),
                q.c.finished_at >= lo, q.c.finished_at < hi).group_by(q.c.source)).all())
            states = {f"{state}/{outcome or '-'}": n for state, outcome, n in conn.execute(
                select(q.c.state, q.c.outcome, func.count()).where(q.c.source == SOURCE)
                .group_by(q.c.state, q.c.outcome)).all()}
            # A row parked once keeps its reason after it is collected; one parked now says `parked`.
            parked_rows = conn.execute(select(q.c.park_reason, func.count()).where(
                q.c.source == SOURCE, or_(q.c.park_reason.is_not(None), q.c.outcome == "parked"))
                .group_by(q.c.park_reason)).all()
            # Per run: its first request and its last answer, from the fetch log.
            spans = {run_id: (epoch_s(first), epoch_s(last)) for run_id, first, last in conn.execute(
                select(log.c.run_id, func.min(log.c.at), func.max(log.c.at)).where(log.c.source == SOURCE)
                .group_by(log.c.run_id)).all()}
        dead = store.dead_letters(source=SOURCE)
        with store.engine.begin() as conn:
            lane_rows = conn.execute(select(s.rate_lanes)).mappings().all()
        lanes = {row["lane"]: {"rate_factor": round(row["rate_factor"], 3),
                               "ceiling_factor": round(row["ceiling_factor"], 3),
                               "last_cut_s": round(row["last_cut_s"] - t0, 1) if row["last_cut_s"] else None}
                 for row in lane_rows if SOURCE in row["lane"].split(":")}
        records = instance.get_run_records()
        runs = []
        for record in records:
            run = record.dagster_run
            if run.tags.get("investigations/source") != SOURCE:
                continue
            first, last = spans.get(run.run_id, (None, None))
            started, ended = epoch_s(record.start_time), epoch_s(record.end_time)
            runs.append({
                "kind": run.tags.get("investigations/priority_class", "other"),
                "status": run.status.value.lower(),
                "leads": int(run.tags.get("investigations/batch_size", "1")),
                "created_s": epoch_s(record.create_timestamp), "started_s": started, "ended_s": ended,
                "first_request_s": first, "last_request_s": last,
                "events": len(instance.all_logs(run.run_id)) if run.tags.get("investigations/batch_size") else None,
            })
    finally:
        store.close()
    runs.sort(key=lambda r: r["created_s"] or 0)
    by_kind = Counter(f"{r['kind']}/{r['status']}" for r in runs)
    batches = [r for r in runs if r["leads"] > 1]
    other_runs = Counter(f"{r.dagster_run.tags.get('investigations/source', '-')}/"
                         f"{r.dagster_run.tags.get('investigations/priority_class', 'other')}" for r in records
                         if r.dagster_run.tags.get("investigations/source") != SOURCE)
    return {
        "stored_in_steady_window": stored,
        "stored_in_steady_window_by_source": stored_by_source,
        "other_sources_runs": dict(sorted(other_runs.items())),
        "queue_states": states,
        "parked": {"rows": sum(n for _, n in parked_rows),
                   "reasons": {reason or NO_REASON: n for reason, n in parked_rows}},
        "dead_letters": len(dead),
        "lanes_at_end": lanes,
        "runs_by_kind": dict(sorted(by_kind.items())),
        "leads_per_run": {kind: [r["leads"] for r in runs if r["kind"] == kind] for kind in sorted({r["kind"] for r in runs})},
        "runs": runs,
        "breakdown": breakdown(runs, t0=t0, end_s=end_s),
        "events_per_lead": (statistics.mean(r["events"] / r["leads"] for r in batches if r["events"])
                            if any(r["events"] for r in batches) else None),
    }


def breakdown(runs: list[dict[str, Any]], *, t0: float, end_s: float) -> dict[str, Any]:
    """Where a batched source's time goes: run starts, and the seconds its lanes had no batch sending.

    - `create_to_start_s`: run created (the dispatcher's handover) to the run worker started;
    - `start_to_first_request_s`: run worker started to its first request (imports, resources, leases);
    - `last_request_to_end_s`: its last answer to the run's end (the last leads' storing, events, teardown);
    - `no_batch_sending_s`: seconds of the run in which no batch was between its first and last request
      (the source's lanes idle for want of a run), with when.
    """
    batches = [r for r in runs if r["leads"] > 1]

    def stat(values: list[float]) -> dict[str, float | int | None]:
        values = [v for v in values if v is not None]
        if not values:
            return {"n": 0, "median": None, "max": None}
        return {"n": len(values), "median": statistics.median(values), "max": max(values)}

    spans = sorted((r["first_request_s"], r["last_request_s"]) for r in batches
                   if r["first_request_s"] is not None and r["last_request_s"] is not None)
    idle, gaps, covered = 0.0, [], t0
    for first, last in spans:
        if first > covered:
            gap = min(first, end_s) - covered
            if gap > 0:
                idle += gap
                gaps.append({"from_s": round(covered - t0, 1), "s": round(gap, 1)})
        covered = max(covered, last)
    if covered < end_s:
        idle += end_s - covered
        gaps.append({"from_s": round(covered - t0, 1), "s": round(end_s - covered, 1), "to_end": True})
    return {
        "batch_runs": len(batches),
        "create_to_start_s": stat([r["started_s"] - r["created_s"] for r in batches
                                   if r["started_s"] and r["created_s"]]),
        "start_to_first_request_s": stat([r["first_request_s"] - r["started_s"] for r in batches
                                          if r["first_request_s"] and r["started_s"]]),
        "last_request_to_end_s": stat([r["ended_s"] - r["last_request_s"] for r in batches
                                       if r["ended_s"] and r["last_request_s"]]),
        "no_batch_sending_s": idle,
        "no_batch_sending_gaps": gaps,
    }


# -- the engine alone ----------------------------------------------------------------------------


def run_engine_phase(args: Any, workdir: Path) -> dict[str, Any]:
    """The engine alone on the same target (a fresh nginx and proxies), configured right."""
    from investigations.store import StateStore

    leads = math.ceil(ceiling_per_s(args) * args.engine_s)
    fleet = prepare_fleet(workdir / "engine", dagster_yaml="", sources_yaml="")
    start_fleet(fleet, services=("sandbox",))
    proc = None
    try:
        sandbox_port = fleet.env["INVESTIGATIONS_SANDBOX_PORT"]
        with Nginx([_limiter("engine", args)], upstream=f"127.0.0.1:{sandbox_port}") as nginx, \
                Proxies(args.identities) as proxies:
            (fleet.base / "sources.yaml").write_text(sources_yaml(nginx.url("engine"), args, 1))
            (fleet.base / "identities.yaml").write_text(identities_yaml(proxies))
            fleet.env["INVESTIGATIONS_IDENTITIES"] = str(fleet.base / "identities.yaml")
            StateStore.from_url(fleet.database_url).close()  # migrate before the engine starts
            deadline = time.time() + 2 * args.engine_s + 60
            proc, out = engine_subprocess({SOURCE: leads}, env=fleet.env, deadline_s=deadline, seed=args.seed,
                                          log=fleet.logs / "engine.log")
            fleet.procs["engine"] = proc
            proc.wait(timeout=deadline - time.time() + 60)
            rows = nginx.client_rows("engine")
            outgoing = dict(zip(proxies.outgoing, (f"proxy{n}" for n in range(args.identities)), strict=True))
    finally:
        fleet.stop()
    if proc is None or proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"engine process failed ({proc and proc.returncode}); see {fleet.logs / 'engine.log'}")
    result = json.loads(out.read_text())
    collected = sum(result["collected"].values())
    t0, end_s = (rows[0][0], rows[-1][0]) if rows else (0.0, 0.0)
    figures = limiter_figures(rows, t0=t0, end_s=end_s + 1e-6, ceiling=ceiling_per_s(args), outgoing=outgoing)
    return {"leads": leads, "collected": collected, "outcomes": result["outcomes"], "cpu_s": result["cpu_s"],
            "wall_s": result["wall_s"], "cpu_per_record_s": result["cpu_s"] / collected if collected else None,
            **figures}


# -- report --------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def report(figures: dict[str, Any]) -> None:
    configs = figures["configs"]
    names = list(configs)
    engine = figures.get("engine")
    cols = names + (["engine"] if engine else [])
    allf = {**configs, **({"engine": engine} if engine else {})}
    cfg = figures["config"]
    rows: list[list[Any]] = [
        ["configured rate / limiter's", *(fmt(configs[n]["rate_factor"]) for n in names), *(["1"] if engine else [])],
        ["ceiling (r/s)", *(fmt(allf[n]["ceiling_per_s"]) for n in cols)],
        [f"OK/s after {WARMUP_S:g} s", *(fmt(allf[n]["ok_per_s"]) for n in cols)],
        [f"OK/s / ceiling after {WARMUP_S:g} s", *(fmt(allf[n]["ratio"]) for n in cols)],
        ["OK/s / ceiling, whole window", *(fmt(allf[n]["window_ratio"]) for n in cols)],
        ["second half OK/s / first half's", *(fmt(allf[n]["halves_ratio"]) for n in cols)],
        ["first minute OK/s / ceiling", *(fmt(allf[n]["first_minute_ratio"]) for n in cols)],
        ["429s (all / after warm-up)", *(f"{allf[n]['refused_429']}/{allf[n]['refused_429_after_warmup']}"
                                         for n in cols)],
        ["refused share after warm-up", *(fmt(allf[n]["refused_share_after_warmup"]) for n in cols)],
        ["429s by zone (per address / site-wide)", *(_zones(configs.get(n, {})) for n in cols)],
        [f"refused share after {HIGH4_WARMUP_S:g} s", *(fmt(allf[n]["refused_share_after_minute"]) for n in cols)],
        ["gap CV per client (min-max)", *(_cv_range(allf[n]["clients"]) for n in cols)],
        ["records stored in the steady window", *(fmt(configs[n]["stored_in_steady_window"]) for n in names),
         *([fmt(engine["collected"])] if engine else [])],
        ["CPU per stored record (ms)", *(_ms(configs[n]["cpu"]["fleet_cpu_per_record_s"]) for n in names),
         *([_ms(engine["cpu_per_record_s"])] if engine else [])],
        ["Postgres server CPU per record (ms)", *(_ms(configs[n]["cpu"].get("postgres_cpu_per_record_s"))
                                                   for n in names), *(["-"] if engine else [])],
        ["fleet CPU / engine CPU per record", *(fmt(configs[n].get("cpu_factor")) for n in names),
         *(["1"] if engine else [])],
        ["identities banned (bans)", *(_bans(configs[n]) for n in names), *(["-"] if engine else [])],
        ["parked collections", *(fmt(configs[n]["parked"]["rows"]) for n in names), *(["-"] if engine else [])],
        ["dead letters", *(fmt(configs[n]["dead_letters"]) for n in names), *(["-"] if engine else [])],
        ["events per lead (batch runs)", *(fmt(configs[n]["events_per_lead"]) for n in names),
         *(["-"] if engine else [])],
    ]
    print_table(f"Product path against nginx limit_req ({cfg['identities']} identities via tinyproxy, "
                f"{cfg['client_rate']} r/s per address burst {cfg['burst']}, {cfg['site_rate']} r/s site-wide "
                f"burst {cfg['site_burst']})", ["", *cols], rows)
    minutes = max(len(allf[n]["per_minute"]) for n in cols)
    print_table("OK/s / ceiling per minute (429s)", ["minute", *cols], [
        [str(m + 1), *(_minute(allf[n]["per_minute"], m) for n in cols)] for m in range(minutes)])
    for name in names:
        c = configs[name]
        b = c["breakdown"]
        print(f"\n  [{name}] runs by kind: {json.dumps(c['runs_by_kind'])}; leads per run: "
              f"{json.dumps(c['leads_per_run'])}")
        print(f"  [{name}] batch runs: created->started {_stat(b['create_to_start_s'])}, "
              f"started->first request {_stat(b['start_to_first_request_s'])}, "
              f"last request->end {_stat(b['last_request_to_end_s'])}; no batch sending for "
              f"{b['no_batch_sending_s']:.1f} s {json.dumps(b['no_batch_sending_gaps'])}")
        print(f"  [{name}] every source's records stored in the steady window: "
              f"{json.dumps(c['stored_in_steady_window_by_source'])}; other sources' runs: "
              f"{json.dumps(c['other_sources_runs'])}")
        print(f"  [{name}] timeline (OK/s, 429s per {TIMELINE_BIN_S:g} s): "
              + " ".join(f"{t['ok_per_s']:.2f}/{t['refused_429']}" for t in c["timeline"]))
        roles = c["cpu"]["roles_s"]
        print(f"  [{name}] CPU s in the steady window: " + ", ".join(f"{k} {v:.1f}" for k, v in roles.items()
                                                                   if v >= 0.05))
        if c["parked"]["rows"]:
            print(f"  [{name}] parked: {json.dumps(c['parked']['reasons'])}")
        cut = {lane: s for lane, s in c["lanes_at_end"].items() if s["last_cut_s"] is not None}
        if cut:
            print(f"  [{name}] lanes cut (factor, ceiling, last cut s after t0): "
                  + ", ".join(f"{lane} {s['rate_factor']}/{s['ceiling_factor']}/{s['last_cut_s']}"
                              for lane, s in cut.items()))
        if c["target_bans"]["bans"]:
            print(f"  [{name}] target's bans: {json.dumps(c['target_bans'])}")
    goals = figures["goals"]
    print(f"\n  goals: right OK/s / ceiling >= {GOAL_RATIO} over the whole window and 0 x 429: {goals['rate']}; "
          f"fleet CPU per record <= {GOAL_CPU_FACTOR} x engine's: {goals['cpu']}; nothing parked without a reason: "
          f"{goals['parking']}")
    print(f"         high ({HIGH_FACTOR}x): OK/s / ceiling >= {GOAL_HIGH_RATIO} over the whole window, second half "
          f">= {GOAL_NO_DECAY} x the first, refused share after {WARMUP_S:g} s <= {GOAL_HIGH_REFUSED_SHARE:.0%}: "
          f"{goals['high']}")
    print(f"         high4 ({HIGH4_FACTOR}x): OK/s / ceiling >= {GOAL_HIGH4_RATIO} over the whole window, refused share "
          f"after {HIGH4_WARMUP_S:g} s <= {GOAL_HIGH4_REFUSED_SHARE:.0%}: {goals['high4']}; defend: 0 identities "
          f"banned and OK/s / ceiling >= {GOAL_RATIO}: {goals['defend']}")


def _minute(bins: list[dict[str, Any]], m: int) -> str:
    return f"{bins[m]['ratio']:.3f} ({bins[m]['refused_429']})" if m < len(bins) else "-"


def _zones(config: dict[str, Any]) -> str:
    zones = config.get("refused_by_zone")
    return f"{zones['address']} / {zones['site']}" if zones else "-"


def _bans(config: dict[str, Any]) -> str:
    bans = config["target_bans"]
    return f"{bans['identities_banned']} ({bans['bans']})" if config["defend"] else "-"


def _cv_range(clients: dict[str, Any]) -> str:
    cvs = [c["gap_cv"] for c in clients.values() if c["gap_cv"] is not None]
    return f"{min(cvs):.2f}-{max(cvs):.2f}" if cvs else "-"


def _stat(entry: dict[str, Any]) -> str:
    if not entry["n"]:
        return "-"
    return f"median {entry['median']:.1f} s (max {entry['max']:.1f}, n {entry['n']})"


# -- main ----------------------------------------------------------------------------------------


def _extra(parser: Any) -> None:
    parser.add_argument("--right-duration-s", type=float, default=None,
                        help="measured seconds of the `right` configuration (default --duration-s; 0 skips it)")
    parser.add_argument("--high-duration-s", type=float, default=None,
                        help="measured seconds of the `high` configuration (default --duration-s; 0 skips it)")
    parser.add_argument("--high4-duration-s", type=float, default=None,
                        help="measured seconds of the `high4` configuration (default --duration-s; 0 skips it)")
    parser.add_argument("--defend-duration-s", type=float, default=None,
                        help="measured seconds of the `defend` configuration (default --duration-s; 0 skips it)")
    parser.add_argument("--engine-s", type=float, default=DEFAULT_ENGINE_S,
                        help=f"the engine-alone phase: its leads are the ceiling's worth of this many seconds "
                             f"(default {DEFAULT_ENGINE_S:g}; 0 skips it)")
    parser.add_argument("--identities", type=int, default=DEFAULT_IDENTITIES,
                        help=f"identities, one tinyproxy each (default {DEFAULT_IDENTITIES})")
    parser.add_argument("--client-rate", type=int, default=DEFAULT_CLIENT_RATE,
                        help=f"nginx's per-address rate, r/s (default {DEFAULT_CLIENT_RATE})")
    parser.add_argument("--site-rate", type=int, default=DEFAULT_SITE_RATE,
                        help=f"nginx's site-wide rate, r/s (default {DEFAULT_SITE_RATE})")
    parser.add_argument("--burst", type=int, default=DEFAULT_BURST,
                        help=f"the per-address zone's burst (default {DEFAULT_BURST}); the fleet's is one below")
    parser.add_argument("--site-burst", type=int, default=DEFAULT_SITE_BURST,
                        help=f"the site-wide zone's burst (default {DEFAULT_SITE_BURST}); the fleet's is one below")
    parser.add_argument("--postgres", action="store_true",
                        help="also run `right` with the state store and Dagster's storage on Postgres (as a "
                             "deployment would; INVESTIGATIONS_BENCH_POSTGRES_URL, else the test server)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, stores) after the run")


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _goal(config: dict[str, Any] | None, met: Any) -> str:
    return "-" if config is None else ("met" if met(config) else "NOT met")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, description=__doc__.splitlines()[0], default_duration_s=DEFAULT_DURATION_S, extra=_extra)
    high_s = args.duration_s if args.high_duration_s is None else args.high_duration_s
    high4_s = args.duration_s if args.high4_duration_s is None else args.high4_duration_s
    defend_s = args.duration_s if args.defend_duration_s is None else args.defend_duration_s
    # SIGTERM ends the bench through its `finally` blocks, so no fleet process outlives it.
    signal.signal(signal.SIGTERM, _interrupt)
    right_s = args.duration_s if args.right_duration_s is None else args.right_duration_s
    configs = ([Config("right", right_s, 1.0)] if right_s > 0 else []) \
        + ([Config("high", high_s, HIGH_FACTOR)] if high_s > 0 else [])
    if high4_s > 0:
        configs.append(Config("high4", high4_s, HIGH4_FACTOR))
    if defend_s > 0:
        configs.append(Config("defend", defend_s, 1.0, defend=True))
    if args.postgres:
        configs.insert(1, Config("right-pg", args.duration_s, 1.0, postgres=True))
    figures: dict[str, Any] = {
        "config": {"duration_s": args.duration_s, "right_duration_s": right_s, "high_duration_s": high_s,
                   "high4_duration_s": high4_s,
                   "defend_duration_s": defend_s,
                   "defend_rules": DEFEND, "engine_s": args.engine_s,
                   "identities": args.identities, "client_rate": args.client_rate, "site_rate": args.site_rate,
                   "burst": args.burst, "site_burst": args.site_burst, "warmup_s": WARMUP_S, "seed": args.seed},
        "engine_version": engine_digest(), "host_before": host_load(), "configs": {}, "engine": None}
    try:
        with bench_workdir("bench-product-", keep=args.keep) as workdir:
            for cfg in configs:
                print(f"\n--- {cfg.name}: configured at {cfg.rate_factor:g} x the limiter's rates ---", flush=True)
                figures["configs"][cfg.name] = run_config(cfg, args, workdir)
            if args.engine_s > 0:
                print("\n--- the engine alone, configured right ---", flush=True)
                figures["engine"] = run_engine_phase(args, workdir)
    except ToolMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    engine_per = (figures["engine"] or {}).get("cpu_per_record_s")
    for c in figures["configs"].values():
        per = c["cpu"]["fleet_cpu_per_record_s"]
        c["cpu_factor"] = per / engine_per if per and engine_per else None
    right = figures["configs"].get("right")
    figures["goals"] = {
        "rate": _goal(right, lambda c: (c["window_ratio"] or 0) >= GOAL_RATIO and c["refused_429"] == 0),
        "cpu": "-" if right is None or right["cpu_factor"] is None
               else ("met" if right["cpu_factor"] <= GOAL_CPU_FACTOR else "NOT met"),
        "parking": "met" if all(NO_REASON not in c["parked"]["reasons"] for c in figures["configs"].values())
                   else "NOT met",
        "high": _goal(figures["configs"].get("high"), lambda c: (c["refused_share_after_warmup"] or 0)
                      <= GOAL_HIGH_REFUSED_SHARE and (c["window_ratio"] or 0) >= GOAL_HIGH_RATIO
                      and (c["halves_ratio"] or 0) >= GOAL_NO_DECAY),
        "high4": _goal(figures["configs"].get("high4"), lambda c: (c["refused_share_after_minute"] or 0)
                       <= GOAL_HIGH4_REFUSED_SHARE and (c["window_ratio"] or 0) >= GOAL_HIGH4_RATIO),
        "defend": _goal(figures["configs"].get("defend"), lambda c: c["target_bans"]["identities_banned"] == 0
                        and (c["ratio"] or 0) >= GOAL_RATIO),
    }
    figures["host_after"] = host_load()
    report(figures)
    path = write_results(NAME, figures, args.results_dir)
    print(f"\nfigures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
