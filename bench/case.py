"""A whole case in one webhook: how long the investigator waits for every lead, against a real limiter.

This is the product path an investigator takes: the case system sends a whole case in ONE signed
delivery, and the investigator waits until every lead of it is collected. For each mode a fleet is
started on loopback as a deployment runs it (docs/deploying.md), as `bench.product` starts it
(`bench.fleet_process`): the project's code server as a service of its own (`dagster code-server
start`: sensors, and the run workers as its children), `dagster-daemon` on `deploy/workspace.yaml`
(run queue, sensor ticks), the webhook intake and the sandbox web, in temp dirs with free ports. In
front of the sandbox's `robust` route stands nginx `limit_req` (`bench.nginx`), one `server` per
measured source, each with two zones, per client address and site-wide, both answering 429; in front
of nginx, one tinyproxy per identity, each sending from its own 127.0.0.x (`bench.proxies`), so nginx
sees one client per identity. The fleet's identities file lists the proxies (`bench.product`'s
`identities_yaml`); each measured source is pointed at its own nginx server and configured to its
limiter as `bench.product`'s `right` configuration is (rates as nginx's, bursts one below nginx's),
with `concurrency` collections in flight per run. A source's ceiling is min(site-wide rate,
identities x per-address rate). The fleet's sources file is the repo's, plus the measured sources.

Once the daemon's `new_leads` sensor ticks, ONE delivery is sent to the intake (`POST /v1/leads`,
Standard Webhooks headers signed with the fleet's secret: `investigations.demo.case.send_case`): N
distinct domain leads, `priority: interactive`, the mode's `sources`, one case id. The clock starts
at the intake's 202 (a 202 means the case is stored). The bench then waits until every (source, lead)
of the case is settled (a row in the store's `collections` table and no row of it left in the
backlog, `collection_queue`), or `--timeout-s` after the 202, whichever comes first.

Modes (one bench run, one after the other, each with a fresh fleet, nginx and proxies):
- `one`: one source, `robust`, against per-address 5 r/s (burst 2) and site-wide 30 r/s (burst 5),
  8 identities: ceiling min(30, 8 x 5) = 30 OK/s; a 300-lead case. Beside it, fresh leads (below):
  a second measured source, `calm`, a copy of `robust` with its own nginx server (site-wide and
  per-address 10 r/s, bursts 5 and 2) and configured to it the same way, is not in the case: only
  fresh leads go to it.
- `four`: a 200-lead case over four sources at 20, 10, 5 and 1.5 r/s, copies of `robust` named
  `rate_20`, `rate_10`, `rate_5` and `rate_1_5`, each with its own nginx server (its own zone pair).
  Choice of limiter: site-wide = the source's rate (burst 5) and per-address = the source's rate too
  (burst 2), generous: no identity is held below the site's rate, so the site-wide zone binds and
  the ceiling is the source's rate. Each source's `concurrency` is `--concurrency` scaled by its
  rate over `one`'s ceiling (at least 2). nginx takes whole rates only, per second or per minute: a
  zone at 1.5 r/s is written `90r/m` (`bench.nginx.nginx_rate`).
- `engine` (unless `--engine-s 0`): the engine alone (one process: `Collector` + `Fetcher` + rate
  lanes + identity pool, no Dagster, `concurrency` threads; `bench.fleet_process.engine_subprocess`)
  on `one`'s target configured the same way, `--engine-s` x the ceiling leads.
- `--postgres` adds `one-pg` / `four-pg`: the same with the state store and Dagster's storage on
  Postgres (fresh databases on INVESTIGATIONS_BENCH_POSTGRES_URL's server, else the test URL's,
  dropped after), as `bench.product` does for `right-pg`.

Figures:
- per source: the bound, 1.5 x leads / ceiling + 10 s (the goal: the whole case within it); from the
  store's `collections` table, `last_success_at` of each (source, lead) minus the 202: first, p50,
  p95 and all (the last lead), nearest rank; a lead not stored when the bench gave up counts with the
  time waited as a lower bound (`>x`), as `bench.urgent`'s percentiles do; the ratio bound / all
  (goal >= 1; `<x` when `all` is a lower bound); failed collections (settled, not stored); from
  nginx's own log, the 202 -> first request and the 429s; from Dagster's run records
  (`DagsterInstance.from_config(dagster_home)`), the runs tagged `investigations/source` and the
  case's `investigations/case`, and the leads per run (`investigations/batch_size`, else 1).
- CPU per collection: every fleet process (daemon, code server and its run workers, intake) sampled
  from /proc (`CpuSampler`) from the 202 until the last poll (every lead settled, or the bench gave
  up), over the collections the store stored in that window (every source: a canary crawl's run is
  the fleet's work too); beside it the engine alone's CPU per collection (its own process, the
  collections only), and their ratio (goal <= 2.5). The sandbox, nginx and the proxies are the web
  and are reported apart.

Fresh leads (`one`, and `one-pg`; the issue's "a fresh single lead reaches its first request at
p95 <= 4 s while another case's 300-lead burst is in flight"): after the case's 202, `--fresh`
single-lead deliveries (default 10), each its own signed webhook with its own case id, `priority:
interactive`, one fresh domain each, at seeded (`--seed`) random moments uniform over [1 s,
0.8 x N / ceiling] after the case's 202 (the burst's expected duration at the ceiling), taken in
order of time alternately for `robust` (the source under the burst) and `calm` (not under load). The
bench waits for the case as above, then until every fresh lead is settled too (at most 120 s after the
last fresh 202, and never past `--timeout-s` after the case's 202). Per fresh lead, from ITS 202: the
first request for it at nginx (the first row of the source's nginx log whose URL's query carries the
lead's value, at its arrival, `$msec - $request_time`) and its storing (`collections.last_success_at`);
per source p50 / p95 / max, nearest rank, a lead not reached or not stored by the end counting with
the time waited as a lower bound (`>x`); the goal, p95 of the first request <= 4 s, met or not; and
whether each was sent while the case was still unfinished (before its last lead was stored). The
case's own figures leave the fresh leads out: its leads only, nginx rows asking for a fresh lead
dropped, its runs by its case id (the fresh leads' runs are not among its `other runs` either). The
CPU window stays the case's (202 to settled), and its collections are every source's, so the fresh
leads stored in it count there as the fleet's work, as canary crawls do.

The bench asserts nothing; goals are reported as met or not met.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from bench.common import (
    RESULTS_DIR,
    ToolMissing,
    bench_workdir,
    dagster_postgres_storage,
    engine_digest,
    epoch_s,
    fmt,
    fresh_databases,
    host_load,
    pg_server_pid,
    pg_url,
    print_table,
    write_results,
)
from bench.fleet_process import ROOT, CpuSampler, Fleet, engine_subprocess, prepare_fleet, start_fleet
from bench.nginx import Limiter, LogRow, Nginx
from bench.product import identities_yaml, sources_yaml
from bench.proxies import Proxies

NAME = "case"
SOURCE = "robust"  # the repo's source whose sandbox route every measured source asks
MODES = ("one", "four")
DEFAULT_LEADS = 300
DEFAULT_FOUR_LEADS = 200
DEFAULT_IDENTITIES = 8
DEFAULT_CLIENT_RATE = 5.0  # `one`: nginx per-address zone, r/s
DEFAULT_SITE_RATE = 30.0  # `one`: nginx site-wide zone, r/s
CLIENT_BURST = 2  # nginx per-address burst (nodelay); the source's identity_burst is one below
SITE_BURST = 5  # nginx site-wide burst (nodelay); the source's source_burst is one below
FOUR_RATES = (20.0, 10.0, 5.0, 1.5)
# In flight per run for `one`'s 30 r/s: an identity is held about 0.3 s per request (lane wait, send
# delay, answer; bench/README.md), so 30 r/s needs about 9 at once; twice that, for lease waits.
DEFAULT_CONCURRENCY = 16
MAX_CONCURRENCY = 64  # SourceSpec's own limit
MIN_CONCURRENCY = 2
DEFAULT_TIMEOUT_S = 900.0
DEFAULT_ENGINE_S = 60.0
BOUND_FACTOR = 1.5  # the bound: BOUND_FACTOR x leads / ceiling + BOUND_SLACK_S
BOUND_SLACK_S = 10.0
GOAL_CPU_FACTOR = 2.5
PRIORITY = "interactive"
SENSOR_TIMEOUT_S = 120.0  # from the services answering to the new-lead sensor's first tick
POLL_S = 1.0
PROGRESS_EVERY_S = 30.0
STORED = ("ok", "empty")  # outcomes of a collection that stored its answer (an empty one too)
CALM = "calm"  # `one`: the second measured source, not under load; only fresh leads go to it
CALM_RATE = 10.0  # its nginx zones, site-wide and per address, r/s: generous
DEFAULT_FRESH = 10  # `one`: fresh single-lead deliveries while the case's burst is in flight
FRESH_FROM_S = 1.0  # fresh deliveries go out uniformly over [FRESH_FROM_S, FRESH_SPREAD x N / ceiling]
FRESH_SPREAD = 0.8  # after the case's 202: within the burst's expected duration at the ceiling
FRESH_WAIT_S = 120.0  # after the last fresh 202, the bench waits at most this long for the fresh leads
GOAL_FRESH_P95_S = 4.0  # the goal: a fresh lead's first request at p95 <= 4 s
FRESH_SEND_TIMEOUT_S = 30.0


# -- pure parts (tests/bench/test_case_bench.py) -------------------------------------------------


@dataclass(frozen=True)
class SourceSetup:
    """One measured source: its name (also its nginx server's), its limiter, its runs' concurrency."""

    name: str
    site_rate: float  # nginx site-wide zone, r/s
    client_rate: float  # nginx per-address zone, r/s
    concurrency: int
    site_burst: int = SITE_BURST
    client_burst: int = CLIENT_BURST

    def ceiling(self, identities: int) -> float:
        return min(self.site_rate, identities * self.client_rate)


@dataclass(frozen=True)
class Mode:
    name: str
    leads: int
    sources: tuple[SourceSetup, ...]  # the case's sources
    postgres: bool = False
    fresh: int = 0  # fresh single-lead deliveries while the case is in flight
    calm: SourceSetup | None = None  # a measured source not in the case (fresh leads only), if any


def bound_s(leads: int, ceiling_per_s: float) -> float:
    """The goal for a case: every lead stored within 1.5 x the time the ceiling allows, plus 10 s."""
    return BOUND_FACTOR * leads / ceiling_per_s + BOUND_SLACK_S


def rate_name(rate: float) -> str:
    """A source name for a rate (source names are lower-case letters, digits and '_'): 1.5 -> rate_1_5."""
    return "rate_" + f"{rate:g}".replace(".", "_")


def scaled_concurrency(concurrency: int, rate: float, reference_rate: float) -> int:
    """`concurrency` (sized for `reference_rate`) scaled to `rate`, within SourceSpec's bounds."""
    return max(MIN_CONCURRENCY, min(MAX_CONCURRENCY, math.ceil(concurrency * rate / reference_rate)))


def mode_setups(name: str, args: Any) -> tuple[SourceSetup, ...]:
    concurrency = max(1, min(MAX_CONCURRENCY, args.concurrency))
    if name == "one":
        return (SourceSetup(SOURCE, site_rate=args.site_rate, client_rate=args.client_rate, concurrency=concurrency),)
    return tuple(SourceSetup(rate_name(rate), site_rate=rate, client_rate=rate,
                             concurrency=scaled_concurrency(concurrency, rate, args.site_rate))
                 for rate in FOUR_RATES)


def calm_setup(args: Any) -> SourceSetup:
    """`one`'s source not under load (fresh leads only): a copy of `robust` behind a generous limiter."""
    return SourceSetup(CALM, site_rate=CALM_RATE, client_rate=CALM_RATE,
                       concurrency=scaled_concurrency(max(1, args.concurrency), CALM_RATE, args.site_rate))


def limiter(setup: SourceSetup) -> Limiter:
    """The source's nginx server: its two zones at the source's rates (nginx writes 1.5 r/s as 90r/m)."""
    return Limiter(setup.name, setup.client_rate, setup.client_burst,
                   site_rate_per_s=setup.site_rate, site_burst=setup.site_burst)


def lead_values(mode: str, count: int) -> list[str]:
    """`count` distinct domains for a mode's case."""
    return [f"case-{mode}-{n:05d}.example" for n in range(count)]


def delivery_body(case_id: str, values: Sequence[str], sources: Sequence[str],
                  priority: str = PRIORITY) -> dict[str, Any]:
    """The whole case as the case system sends it: one delivery, every lead, the wanted sources."""
    return {"case_id": case_id, "leads": [{"kind": "domain", "value": value} for value in values],
            "sources": list(sources), "priority": priority}


def case_sources_yaml(setups: Sequence[SourceSetup], urls: Mapping[str, str]) -> str:
    """The repo's sources with each measured source pointed at its nginx server and configured to its
    limiter as `bench.product`'s `right` configuration is: rates as nginx's, bursts one below nginx's
    (`bench.product.sources_yaml` configures `robust`; a source of another name is a copy of it)."""
    first = setups[0]
    # bench.product takes one burst for both zones; the site-wide one here, the per-address one below.
    product_args = SimpleNamespace(site_rate=first.site_rate, client_rate=first.client_rate, burst=first.site_burst)
    config = yaml.safe_load(sources_yaml(urls[first.name], product_args, 1.0))
    index = next(n for n, entry in enumerate(config["sources"]) if entry["name"] == SOURCE)
    template = config["sources"][index]
    if SOURCE not in urls:
        # `robust` itself is not measured: it stays as the repo has it (straight to the sandbox).
        repo = yaml.safe_load((ROOT / "sources.yaml").read_text())
        config["sources"][index] = next(entry for entry in repo["sources"] if entry["name"] == SOURCE)
    for setup in setups:
        entry = json.loads(json.dumps(template))  # a deep copy
        entry["name"] = setup.name
        entry["request"]["url"] = template["request"]["url"].replace(urls[first.name], urls[setup.name])
        entry["rate"] = {"source_per_s": setup.site_rate, "source_burst": max(1, setup.site_burst - 1),
                         "identity_per_s": setup.client_rate, "identity_burst": max(1, setup.client_burst - 1)}
        entry["concurrency"] = setup.concurrency
        if setup.name == SOURCE:
            config["sources"][index] = entry
        else:
            entry["description"] = f"{SOURCE}'s route behind a limiter of its own ({setup.site_rate:g} r/s)"
            config["sources"].append(entry)
    return yaml.safe_dump(config, sort_keys=False)


def _ranked(values: Iterable[tuple[float, bool]], cells: Mapping[str, float]) -> dict[str, Any]:
    """Nearest-rank cells (name: p, 0 the first, 1 the last) of (seconds, exact) values, sorted here.

    As `bench.urgent.summarize`: a cell is exact only when it falls on an exact value and no lower
    bound lies below it (that value may truly lie on either side); otherwise it is a lower bound.
    """
    ordered = sorted(values)
    if not ordered:
        return dict.fromkeys(cells)

    def cell(p: float) -> dict[str, Any]:
        value, exact = ordered[max(0, math.ceil(p * len(ordered)) - 1)]
        exact = exact and not any(not known and bound < value for bound, known in ordered)
        return {"s": value, "lower_bound": not exact}

    return {name: cell(p) for name, p in cells.items()}


def completion_summary(seconds: Sequence[float | None], waited_s: float) -> dict[str, Any]:
    """first / p50 / p95 / all of the seconds from the 202 to each lead's storing, nearest rank.

    A lead not stored (None) counts with `waited_s` as a lower bound (`_ranked`).
    """
    values = [(s, True) for s in seconds if s is not None] + [(waited_s, False) for s in seconds if s is None]
    out: dict[str, Any] = {"n": len(values), "stored": sum(exact for _, exact in values),
                           "unfinished": sum(not exact for _, exact in values)}
    return {**out, **_ranked(values, {"first": 0.0, "p50": 0.50, "p95": 0.95, "all": 1.0})}


def latency_summary(seconds: Sequence[tuple[float | None, float]]) -> dict[str, Any]:
    """p50 / p95 / max, nearest rank, of (seconds, waited) pairs, one a lead: a lead whose seconds are
    None (not reached, not stored) counts with the seconds it was waited for as a lower bound."""
    values = [(s, True) if s is not None else (waited, False) for s, waited in seconds]
    out: dict[str, Any] = {"n": len(values), "done": sum(exact for _, exact in values),
                           "unfinished": sum(not exact for _, exact in values)}
    return {**out, **_ranked(values, {"p50": 0.50, "p95": 0.95, "max": 1.0})}


def within_goal(cell: dict[str, Any] | None, goal_s: float) -> str:
    """`met` (exact and <= goal), `NOT met` (above the goal, exact or a lower bound), `-` (unknown)."""
    if not cell:
        return "-"
    if cell["s"] > goal_s:
        return "NOT met"
    return "-" if cell["lower_bound"] else "met"


@dataclass(frozen=True)
class FreshLead:
    """One fresh single-lead delivery: when (seconds after the case's 202), to which source, what."""

    n: int
    offset_s: float
    source: str
    value: str
    case_id: str


def fresh_plan(count: int, *, leads: int, ceiling_per_s: float, sources: Sequence[str], seed: int, mode: str,
               case_id: str) -> list[FreshLead]:
    """`count` fresh leads at seeded moments uniform over [FRESH_FROM_S, FRESH_SPREAD x leads / ceiling]
    after the case's 202 (the burst's expected duration), in order of time, taking `sources` in turn."""
    rng = random.Random(seed)
    hi = max(FRESH_FROM_S, FRESH_SPREAD * leads / ceiling_per_s)
    offsets = sorted(rng.uniform(FRESH_FROM_S, hi) for _ in range(count))
    return [FreshLead(n, offset, sources[n % len(sources)], f"fresh-{mode}-{n:03d}.example", f"{case_id}-fresh-{n:03d}")
            for n, offset in enumerate(offsets)]


def query_values(uri: str) -> set[str]:
    """The values of a logged URL's query (`/robust/api/lookup?kind=domain&q=a.example` -> {domain, a.example})."""
    return {value for _, value in parse_qsl(urlsplit(uri).query, keep_blank_values=True)}


def first_arrival(rows: Iterable[LogRow], value: str) -> float | None:
    """When the first request asking for `value` (in its URL's query) reached nginx, or None."""
    return min((row.arrived for row in rows if value in query_values(row.uri)), default=None)


def bound_ratio(bound: float, all_cell: dict[str, Any] | None) -> dict[str, Any] | None:
    """bound / all; when `all` is a lower bound, the ratio is an upper bound."""
    if not all_cell or all_cell["s"] <= 0:
        return None
    return {"value": bound / all_cell["s"], "upper_bound": all_cell["lower_bound"]}


def goal_met(ratio: dict[str, Any] | None) -> str:
    """`met` (bound / all >= 1, exact), `NOT met` (below 1, exact or not) or `-` (the bench gave up
    before the bound: unknown)."""
    if ratio is None:
        return "-"
    if ratio["value"] < 1:
        return "NOT met"
    return "-" if ratio["upper_bound"] else "met"


def cell_text(cell: dict[str, Any] | None, digits: int = 1) -> str:
    if not cell:
        return "-"
    return f"{'>' if cell['lower_bound'] else ''}{cell['s']:.{digits}f}"


def ratio_text(ratio: dict[str, Any] | None) -> str:
    if not ratio:
        return "-"
    return f"{'<' if ratio['upper_bound'] else ''}{ratio['value']:.2f}"


# -- fresh leads -------------------------------------------------------------------------------


class FreshSender(threading.Thread):
    """Sends each fresh lead as its own signed delivery at its moment after the case's 202; records
    per lead when it was sent and answered, the answer and the lead id (`sent`, in order)."""

    def __init__(self, plan: Sequence[FreshLead], *, intake_url: str, secret: str, accepted_s: float) -> None:
        super().__init__(name="bench-case-fresh", daemon=True)
        self.plan, self.intake_url, self.secret, self.accepted_s = list(plan), intake_url, secret, accepted_s
        self.sent: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def halt(self) -> None:
        self._halt.set()

    def run(self) -> None:
        from investigations.demo.case import send_case

        for lead in self.plan:
            if self._halt.wait(max(0.0, self.accepted_s + lead.offset_s - time.time())):
                return
            body = delivery_body(lead.case_id, [lead.value], [lead.source])
            row: dict[str, Any] = {"n": lead.n, "source": lead.source, "value": lead.value, "case_id": lead.case_id,
                                   "planned_offset_s": lead.offset_s, "sent_s": time.time(), "status": None,
                                   "lead_id": None, "error": None}
            try:
                answer = send_case(self.intake_url, self.secret, body, timeout_s=FRESH_SEND_TIMEOUT_S)
                row["status"] = answer.status_code
                if answer.status_code == 202:
                    row["lead_id"] = answer.json()["leads"][0]["lead_id"]
                else:
                    row["error"] = answer.text[:300]
            except Exception as exc:  # recorded and reported: one failed send must not stop the others
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["accepted_s"] = time.time()
            self.sent.append(row)


# -- one mode ------------------------------------------------------------------------------------


def run_mode(mode: Mode, args: Any, workdir: Path) -> dict[str, Any]:
    """One mode measured; on Postgres, in fresh databases dropped afterwards."""
    with fresh_databases("case", wanted=mode.postgres) as databases:
        return measure_mode(mode, args, workdir, databases)


def measure_mode(mode: Mode, args: Any, workdir: Path, databases: Sequence[str]) -> dict[str, Any]:
    from dagster import DagsterInstance

    from investigations.demo.case import send_case
    from investigations.demo.fleet import stop_all

    dagster_yaml = (ROOT / "dagster.yaml").read_text()
    if databases:
        dagster_yaml += "\n" + yaml.safe_dump({"storage": dagster_postgres_storage(databases[1])}, sort_keys=False)
    fleet = prepare_fleet(workdir / mode.name, dagster_yaml=dagster_yaml, sources_yaml="")
    if databases:
        fleet.database_url = fleet.env["INVESTIGATIONS_DATABASE_URL"] = pg_url(databases[0])
    names = [setup.name for setup in mode.sources]
    case_id = f"case-bench-{mode.name}-{uuid.uuid4().hex[:6]}"
    sampler: CpuSampler | None = None
    plan = (fresh_plan(mode.fresh, leads=mode.leads, ceiling_per_s=mode.sources[0].ceiling(args.identities),
                       sources=(mode.sources[0].name, mode.calm.name), seed=args.seed, mode=mode.name,
                       case_id=case_id) if mode.fresh and mode.calm else [])
    sender: FreshSender | None = None
    fresh_sent: list[dict[str, Any]] = []
    fresh_end_s, fresh_settled = 0.0, False
    try:
        start_fleet(fleet, services=("sandbox",))
        upstream = f"127.0.0.1:{fleet.env['INVESTIGATIONS_SANDBOX_PORT']}"
        measured = (*mode.sources, *((mode.calm,) if mode.calm else ()))
        with Nginx([limiter(setup) for setup in measured], upstream=upstream) as nginx, \
                Proxies(args.identities) as proxies:
            urls = {setup.name: nginx.url(setup.name) for setup in measured}
            (fleet.base / "sources.yaml").write_text(case_sources_yaml(measured, urls))
            (fleet.base / "identities.yaml").write_text(identities_yaml(proxies))
            fleet.env["INVESTIGATIONS_IDENTITIES"] = str(fleet.base / "identities.yaml")
            # Dagster's storage first, before the fleet's processes create it concurrently.
            instance = DagsterInstance.from_config(str(fleet.dagster_home))
            instance.get_runs(limit=1)
            fleet.env["BENCH_WORKSPACE"] = str(ROOT / "deploy" / "workspace.yaml")
            started_s = time.time()
            start_fleet(fleet, services=("code-server", "intake", "daemon"))
            groups: dict[str, int | tuple[int, ...]] = {
                "dagster": (fleet.procs["daemon"].pid, fleet.procs["code-server"].pid),
                "intake": fleet.procs["intake"].pid, "sandbox": fleet.procs["sandbox"].pid,
                "nginx": nginx._proc.pid if nginx._proc else 0,
                "proxies": tuple(proc.pid for proc in proxies.procs)}
            if databases and (server := pg_server_pid()):
                groups["postgres"] = server
            sampler = CpuSampler(groups).start()
            ticking = wait_sensor_ticking(instance, fleet, timeout_s=SENSOR_TIMEOUT_S)
            print(f"  [{mode.name}] services up in {time.time() - started_s:.0f} s; new-lead sensor "
                  f"{'ticking' if ticking else 'NOT seen ticking (sending anyway)'} (logs: {fleet.logs})", flush=True)
            body = delivery_body(case_id, lead_values(mode.name, mode.leads), names)
            sent_s = time.time()
            answer = send_case(fleet.intake_url, fleet.env["INVESTIGATIONS_WEBHOOK_SECRET"], body, timeout_s=60.0)
            accepted_s = time.time()
            if answer.status_code != 202:
                raise RuntimeError(f"the intake answered {answer.status_code}: {answer.text[:500]}")
            lead_ids = [entry["lead_id"] for entry in answer.json()["leads"]]
            if plan:
                sender = FreshSender(plan, intake_url=fleet.intake_url,
                                     secret=fleet.env["INVESTIGATIONS_WEBHOOK_SECRET"], accepted_s=accepted_s)
                sender.start()
            print(f"  [{mode.name}] one delivery of {mode.leads} leads x {len(names)} source(s): 202 in "
                  f"{accepted_s - sent_s:.2f} s; waiting up to {args.timeout_s:.0f} s"
                  + (f"; {len(plan)} fresh leads over +{plan[0].offset_s:.1f}..+{plan[-1].offset_s:.1f} s "
                     f"({', '.join(sorted({lead.source for lead in plan}))})" if plan else ""), flush=True)
            deadline_s = accepted_s + args.timeout_s
            end_s, settled = wait_settled(fleet, [(name, lead_id) for name in names for lead_id in lead_ids],
                                          accepted_s=accepted_s, deadline_s=deadline_s, label=mode.name)
            sampler.stop()
            if sender is not None:
                # Every fresh lead sent (they are due within the burst's expected time), then stored.
                sender.join(timeout=max(0.0, deadline_s - time.time()))
                sender.halt()
                sender.join()
                fresh_sent = list(sender.sent)
                pairs = [(row["source"], row["lead_id"]) for row in fresh_sent if row["lead_id"]]
                last_s = max((row["accepted_s"] for row in fresh_sent), default=end_s)
                fresh_end_s, fresh_settled = wait_settled(
                    fleet, pairs, accepted_s=accepted_s, deadline_s=min(deadline_s, max(end_s, last_s + FRESH_WAIT_S)),
                    label=f"{mode.name} fresh")
            # Dagster first: a run still collecting while the sandbox goes would log its 502s as failures.
            stop_all([fleet.procs.pop(name) for name in ("daemon", "code-server", "intake")])
            logged = {setup.name: nginx.request_rows(setup.name) for setup in measured}
            fleet.stop()
    finally:
        if sender is not None:
            sender.halt()
        if sampler is not None:
            sampler.stop()
        fleet.stop()
    print(f"  [{mode.name}] {'every lead settled' if settled else 'gave up'} {end_s - accepted_s:.0f} s after "
          f"the 202" + (f"; fresh leads {'settled' if fresh_settled else 'NOT all settled'} "
                        f"{fresh_end_s - accepted_s:.0f} s after it" if sender is not None else "")
          + "; reading the store, nginx's log and Dagster's run records", flush=True)
    # The case's figures leave the fresh leads out: nginx rows asking for one are not the case's.
    fresh_values = {lead.value for lead in plan}
    rows = {name: [(r.at, r.status, r.address) for r in logged[name] if not fresh_values & query_values(r.uri)]
            for name in names}
    figures = analyse_mode(mode, args, fleet, lead_ids, case_id=case_id, sent_s=sent_s, accepted_s=accepted_s,
                           end_s=end_s, nginx_rows=rows, sampler=sampler,
                           other_cases={lead.case_id for lead in plan})
    out = {"mode": mode.name, "postgres": mode.postgres, "case_id": case_id, "leads": mode.leads,
           "sources_measured": names, "sent_s": sent_s, "accepted_s": accepted_s, "answer_s": accepted_s - sent_s,
           "end_s": end_s, "waited_s": end_s - accepted_s, "settled": settled, **figures}
    if sender is not None:
        out["fresh"] = analyse_fresh(mode, fleet, fresh_sent, logged, case_accepted_s=accepted_s,
                                     case_done_s=case_done_s(figures, accepted_s=accepted_s, end_s=end_s),
                                     end_s=fresh_end_s,
                                     settled=fresh_settled)
    return out


def wait_sensor_ticking(instance: Any, fleet: Fleet, *, timeout_s: float) -> bool:
    """Wait until the daemon has started a tick of the new-lead sensor (its state and a tick
    recorded): from then on it polls the inbox. False if not seen within `timeout_s`."""
    from dagster._core.scheduler.instigation import InstigatorType

    from sensors.new_leads import NEW_LEAD_SENSOR

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fleet.check_alive()
        try:
            for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
                if state.name == NEW_LEAD_SENSOR and instance.get_ticks(state.instigator_origin_id,
                                                                        state.selector_id, limit=1):
                    return True
        except Exception:  # storage busy (SQLite) or not written yet: ask again
            pass
        time.sleep(0.5)
    return False


def wait_settled(fleet: Fleet, pairs: Sequence[tuple[str, str]], *, accepted_s: float, deadline_s: float,
                 label: str) -> tuple[float, bool]:
    """Poll the store until every (source, lead id) of `pairs` has a `collections` row and none of its
    backlog rows is left (queued, parked or dispatched), or until `deadline_s`. Returns (when, all settled)."""
    from sqlalchemy import select

    from investigations.store import StateStore
    from investigations.store import schema as s

    c, q = s.collections, s.collection_queue
    wanted_pairs = set(pairs)
    wanted = len(wanted_pairs)
    lead_ids = sorted({lead_id for _, lead_id in wanted_pairs})
    sources = sorted({source for source, _ in wanted_pairs})
    store = StateStore.from_url(fleet.database_url)
    next_progress = accepted_s + PROGRESS_EVERY_S
    try:
        while True:
            now = time.time()
            with store.engine.begin() as conn:
                rows = conn.execute(select(c.c.source, c.c.lead_id, c.c.outcome).where(
                    c.c.lead_id.in_(lead_ids), c.c.source.in_(sources))).all()
                pending = {(row.source, row.lead_id) for row in conn.execute(select(q.c.source, q.c.lead_id).where(
                    q.c.lead_id.in_(lead_ids), q.c.source.in_(sources), q.c.state != "done"))} & wanted_pairs
            done = [row for row in rows if (row.source, row.lead_id) in wanted_pairs]
            settled = [row for row in done if (row.source, row.lead_id) not in pending]
            if len(settled) >= wanted:
                return now, True
            if now >= deadline_s:
                return now, False
            if now >= next_progress:
                stored = sum(1 for row in settled if row.outcome in STORED)
                print(f"  [{label}] {now - accepted_s:.0f} s: {stored}/{wanted} stored, "
                      f"{len(settled) - stored} failed, {len(pending)} in the backlog", flush=True)
                next_progress += PROGRESS_EVERY_S
            fleet.check_alive()
            time.sleep(max(0.0, POLL_S - (time.time() - now)))
    finally:
        store.close()


# -- figures -------------------------------------------------------------------------------------


def analyse_mode(mode: Mode, args: Any, fleet: Fleet, lead_ids: Sequence[str], *, case_id: str, sent_s: float,
                 accepted_s: float, end_s: float, nginx_rows: Mapping[str, list[tuple[float, int, str]]],
                 sampler: CpuSampler | None, other_cases: Iterable[str] = ()) -> dict[str, Any]:
    """Per source: completion times (store), requests and 429s (nginx), runs (Dagster); and the CPU.

    Runs of `other_cases` (the fresh leads') are left out of the source's `other_runs`."""
    from dagster import DagsterInstance
    from sqlalchemy import func, select

    from investigations.store import StateStore
    from investigations.store import schema as s

    names = [setup.name for setup in mode.sources]
    c, q = s.collections, s.collection_queue
    store = StateStore.from_url(fleet.database_url)
    try:
        with store.engine.begin() as conn:
            collections = conn.execute(select(c.c.source, c.c.lead_id, c.c.outcome, c.c.last_success_at).where(
                c.c.lead_id.in_(lead_ids), c.c.source.in_(names))).all()
            parked = dict(conn.execute(select(q.c.source, func.count()).where(
                q.c.lead_id.in_(lead_ids), q.c.source.in_(names), q.c.park_reason.is_not(None))
                .group_by(q.c.source)).all())
            lo, hi = (datetime.fromtimestamp(x, UTC) for x in (accepted_s, end_s))
            # Every source's collections stored in the CPU window: the fleet's work in it.
            stored_in_window = dict(conn.execute(select(q.c.source, func.count()).where(
                q.c.state == "done", q.c.outcome.in_(STORED), q.c.finished_at >= lo, q.c.finished_at <= hi)
                .group_by(q.c.source)).all())
    finally:
        store.close()
    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    skipped = set(other_cases)
    records = [r for r in instance.get_run_records() if r.dagster_run.tags.get("investigations/case") not in skipped]

    sources: dict[str, Any] = {}
    for setup in mode.sources:
        mine = [row for row in collections if row.source == setup.name]
        by_lead = {row.lead_id: row for row in mine}
        seconds: list[float | None] = []
        for lead_id in lead_ids:
            row = by_lead.get(lead_id)
            stored = epoch_s(row.last_success_at) if row is not None and row.outcome in STORED else None
            seconds.append(stored - accepted_s if stored is not None and stored <= end_s else None)
        summary = completion_summary(seconds, end_s - accepted_s)
        ceiling = setup.ceiling(args.identities)
        bound = bound_s(mode.leads, ceiling)
        ratio = bound_ratio(bound, summary["all"])
        rows = [r for r in nginx_rows.get(setup.name, []) if r[0] >= sent_s]
        ok = [r for r in rows if 200 <= r[1] < 300]
        runs = [r for r in records if r.dagster_run.tags.get("investigations/source") == setup.name]
        case_runs = [r for r in runs if r.dagster_run.tags.get("investigations/case") == case_id]
        created = [epoch_s(r.create_timestamp) for r in case_runs]
        leads_per_run = Counter(int(r.dagster_run.tags.get("investigations/batch_size", "1")) for r in case_runs)
        sources[setup.name] = {
            "leads": mode.leads, "ceiling_per_s": ceiling, "site_rate_per_s": setup.site_rate,
            "client_rate_per_s": setup.client_rate, "site_burst": setup.site_burst,
            "client_burst": setup.client_burst, "concurrency": setup.concurrency,
            "bound_s": bound, "completion_s": summary, "bound_over_all": ratio, "goal": goal_met(ratio),
            "failed": sum(1 for row in mine if row.outcome not in STORED),
            "parked_with_reason": parked.get(setup.name, 0),
            "first_request_after_202_s": rows[0][0] - accepted_s if rows else None,
            "requests": len(rows), "ok": len(ok), "refused_429": sum(1 for r in rows if r[1] == 429),
            "other_statuses": dict(Counter(str(r[1]) for r in rows if not (200 <= r[1] < 300 or r[1] == 429))),
            # OK/s from the first to the last OK answer nginx logged: the rate the case was served at.
            "ok_per_s": (len(ok) - 1) / (ok[-1][0] - ok[0][0]) if len(ok) > 2 and ok[-1][0] > ok[0][0] else None,
            "case_runs": len(case_runs),
            "case_runs_by_status": dict(Counter(r.dagster_run.status.value.lower() for r in case_runs)),
            "leads_per_run": {str(k): v for k, v in sorted(leads_per_run.items())},
            "first_run_created_after_202_s": min(created) - accepted_s if created else None,
            "last_run_created_after_202_s": max(created) - accepted_s if created else None,
            "other_runs": dict(Counter(r.dagster_run.tags.get("investigations/priority_class", "other")
                                       for r in runs if r.dagster_run.tags.get("investigations/case") != case_id)),
        }
    cpu = sampler.window(accepted_s, end_s) if sampler else {}
    groups = cpu.get("groups", {})
    fleet_cpu = groups.get("dagster", 0.0) + groups.get("intake", 0.0)
    stored_all = sum(stored_in_window.values())
    return {
        "sources": sources,
        "goal": "met" if all(v["goal"] == "met" for v in sources.values()) else (
            "NOT met" if any(v["goal"] == "NOT met" for v in sources.values()) else "-"),
        "dagster_runs": len(records),
        "cpu": {"window_s": cpu.get("seconds"), "fleet_cpu_s": fleet_cpu, "groups_s": groups,
                "roles_s": cpu.get("roles", {}), "processes": cpu.get("processes", {}),
                "machine_cores_busy": cpu["machine_busy_s"] / cpu["seconds"] if cpu.get("seconds") else None,
                "stored_in_window": stored_all, "stored_in_window_by_source": stored_in_window,
                "fleet_cpu_per_collection_s": fleet_cpu / stored_all if stored_all else None,
                "postgres_cpu_per_collection_s": (groups["postgres"] / stored_all
                                                  if stored_all and "postgres" in groups else None)},
    }


def case_done_s(figures: Mapping[str, Any], *, accepted_s: float, end_s: float) -> float:
    """When the case's last lead was stored (every source's `all`), else when the bench stopped waiting."""
    cells = [src["completion_s"]["all"] for src in figures["sources"].values()]
    if not cells or any(cell is None or cell["lower_bound"] for cell in cells):
        return end_s
    return accepted_s + max(cell["s"] for cell in cells)


def analyse_fresh(mode: Mode, fleet: Fleet, sent: Sequence[dict[str, Any]], logged: Mapping[str, Sequence[LogRow]], *,
                  case_accepted_s: float, case_done_s: float, end_s: float, settled: bool) -> dict[str, Any]:
    """Per fresh lead, from its own 202: its first request at nginx and its storing; per source p50 / p95
    / max of each (a lead not reached or not stored by `end_s` counts as a lower bound) and the goal."""
    from dagster import DagsterInstance
    from sqlalchemy import select

    from investigations.store import StateStore
    from investigations.store import schema as s

    c, q = s.collections, s.collection_queue
    ids = [row["lead_id"] for row in sent if row["lead_id"]]
    store = StateStore.from_url(fleet.database_url)
    try:
        with store.engine.begin() as conn:
            stored = {(row.source, row.lead_id): epoch_s(row.last_success_at) for row in conn.execute(
                select(c.c.source, c.c.lead_id, c.c.outcome, c.c.last_success_at).where(c.c.lead_id.in_(ids)))
                if row.outcome in STORED and row.last_success_at is not None}
            # Each fresh lead's queue row: when it was handed over (to a run of its own, or joined to
            # an open one) and when its collection began; the first handover counts.
            handed: dict[tuple[str, str], tuple[float | None, float | None, str | None]] = {}
            for row in conn.execute(select(q.c.source, q.c.lead_id, q.c.dispatched_at, q.c.started_at, q.c.handover_key)
                                    .where(q.c.lead_id.in_(ids)).order_by(q.c.id)):
                handed.setdefault((row.source, row.lead_id), (epoch_s(row.dispatched_at), epoch_s(row.started_at),
                                                              row.handover_key))
    finally:
        store.close()
    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    case_of_handover = {record.dagster_run.tags.get("investigations/handover"): record.dagster_run.tags.get(
        "investigations/case") for record in instance.get_run_records()}

    def since(at: float | None, start: float) -> float | None:
        return at - start if at is not None and at <= end_s else None

    leads: list[dict[str, Any]] = []
    for row in sent:
        start = row["accepted_s"]
        first = first_arrival(logged.get(row["source"], ()), row["value"]) if row["lead_id"] else None
        dispatched, began, key = handed.get((row["source"], row["lead_id"]), (None, None, None))
        leads.append({**row, "offset_after_case_202_s": start - case_accepted_s,
                      "during_burst": row["sent_s"] < case_done_s, "answer_s": start - row["sent_s"],
                      "waited_s": end_s - start,
                      "first_request_s": since(first, start),
                      "stored_s": since(stored.get((row["source"], row["lead_id"])), start),
                      "handed_over_s": since(dispatched, start), "collection_began_s": since(began, start),
                      # Collected by a run of another case: it joined that run while it was open.
                      "joined": key is not None and case_of_handover.get(key) not in (None, row["case_id"])})
    sources: dict[str, Any] = {}
    for name in dict.fromkeys(row["source"] for row in leads):
        mine = [row for row in leads if row["source"] == name]
        reached = latency_summary([(row["first_request_s"], row["waited_s"]) for row in mine])
        sources[name] = {
            "under_load": name != CALM, "sent": len(mine),
            "accepted": sum(1 for row in mine if row["lead_id"]),
            "during_burst": sum(1 for row in mine if row["during_burst"]),
            "first_request_s": reached,
            "stored_s": latency_summary([(row["stored_s"], row["waited_s"]) for row in mine]),
            "handed_over_s": latency_summary([(row["handed_over_s"], row["waited_s"]) for row in mine]),
            "collection_began_s": latency_summary([(row["collection_began_s"], row["waited_s"]) for row in mine]),
            "joined": sum(1 for row in mine if row["joined"]),
            "goal_first_request_p95": within_goal(reached["p95"], GOAL_FRESH_P95_S),
        }
    calm = mode.calm
    return {"planned": mode.fresh, "goal_first_request_p95_s": GOAL_FRESH_P95_S,
            "calm": calm and {"name": calm.name, "site_rate_per_s": calm.site_rate, "client_rate_per_s": calm.client_rate,
                              "site_burst": calm.site_burst, "client_burst": calm.client_burst,
                              "concurrency": calm.concurrency},
            "case_done_after_202_s": case_done_s - case_accepted_s,
            "end_after_case_202_s": end_s - case_accepted_s, "settled": settled,
            "sources": sources, "leads": leads}


# -- the engine alone ----------------------------------------------------------------------------


def run_engine_alone(args: Any, workdir: Path) -> dict[str, Any]:
    """The engine alone on `one`'s target (a fresh sandbox, nginx and proxies), configured the same way.

    `bench.product.run_engine_phase` takes one burst for both zones and the repo's `concurrency`; this
    is the same phase with the case's limiter and concurrency."""
    from investigations.store import StateStore

    setup = mode_setups("one", args)[0]
    leads = math.ceil(setup.ceiling(args.identities) * args.engine_s)
    fleet = prepare_fleet(workdir / "engine", dagster_yaml="", sources_yaml="")
    proc = None
    out = fleet.logs / "engine.json"
    try:
        start_fleet(fleet, services=("sandbox",))
        upstream = f"127.0.0.1:{fleet.env['INVESTIGATIONS_SANDBOX_PORT']}"
        with Nginx([limiter(setup)], upstream=upstream) as nginx, Proxies(args.identities) as proxies:
            (fleet.base / "sources.yaml").write_text(case_sources_yaml([setup], {setup.name: nginx.url(setup.name)}))
            (fleet.base / "identities.yaml").write_text(identities_yaml(proxies))
            fleet.env["INVESTIGATIONS_IDENTITIES"] = str(fleet.base / "identities.yaml")
            StateStore.from_url(fleet.database_url).close()  # migrate before the engine starts
            deadline = time.time() + 2 * args.engine_s + 60
            proc, out = engine_subprocess({setup.name: leads}, env=fleet.env, deadline_s=deadline, seed=args.seed,
                                          log=fleet.logs / "engine.log")
            fleet.procs["engine"] = proc
            proc.wait(timeout=deadline - time.time() + 60)
            rows = nginx.client_rows(setup.name)
    finally:
        fleet.stop()
    if proc is None or proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"engine process failed ({proc and proc.returncode}); see {fleet.logs / 'engine.log'}")
    result = json.loads(out.read_text())
    collected = sum(result["collected"].values())
    ok = [r for r in rows if 200 <= r[1] < 300]
    return {"source": setup.name, "leads": leads, "concurrency": setup.concurrency, "collected": collected,
            "outcomes": result["outcomes"], "cpu_s": result["cpu_s"], "wall_s": result["wall_s"],
            "cpu_per_collection_s": result["cpu_s"] / collected if collected else None,
            "ceiling_per_s": setup.ceiling(args.identities), "requests": len(rows), "ok": len(ok),
            "refused_429": sum(1 for r in rows if r[1] == 429),
            "ok_per_s": (len(ok) - 1) / (ok[-1][0] - ok[0][0]) if len(ok) > 2 and ok[-1][0] > ok[0][0] else None}


# -- report --------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _cells(summary: dict[str, Any]) -> str:
    return " / ".join(cell_text(summary[k], 2) for k in ("p50", "p95", "max"))


def report_fresh(name: str, fresh: dict[str, Any], case_leads: int) -> None:
    srcs = fresh["sources"]
    cols = list(srcs)
    rows: list[list[Any]] = [
        ["fresh deliveries sent / 202", *(f"{srcs[n]['sent']} / {srcs[n]['accepted']}" for n in cols)],
        ["sent before the case's last lead stored", *(fmt(srcs[n]["during_burst"]) for n in cols)],
        ["202 -> first request at nginx p50 / p95 / max (s)", *(_cells(srcs[n]["first_request_s"]) for n in cols)],
        ["202 -> handed over p50 / p95 / max (s)", *(_cells(srcs[n]["handed_over_s"]) for n in cols)],
        ["202 -> its collection began p50 / p95 / max (s)", *(_cells(srcs[n]["collection_began_s"]) for n in cols)],
        ["joined another case's open run", *(fmt(srcs[n]["joined"]) for n in cols)],
        ["202 -> stored p50 / p95 / max (s)", *(_cells(srcs[n]["stored_s"]) for n in cols)],
        ["not reached / not stored", *(f"{srcs[n]['first_request_s']['unfinished']} / "
                                       f"{srcs[n]['stored_s']['unfinished']}" for n in cols)],
        [f"goal: first request p95 <= {fresh['goal_first_request_p95_s']:g} s",
         *(srcs[n]["goal_first_request_p95"] for n in cols)],
    ]
    print_table(f"Mode {name}: fresh single-lead deliveries ({PRIORITY}) while the {case_leads}-lead case is in "
                f"flight (its last lead stored {fresh['case_done_after_202_s']:.1f} s after its 202); times from each "
                f"fresh lead's own 202", ["", *(f"{n} (under the burst)" if srcs[n]["under_load"] else n
                                                for n in cols)], rows)
    print(f"  [{name}] fresh leads (sent at +s after the case's 202: source, first request / stored s after its 202): "
          + "; ".join(f"+{row['offset_after_case_202_s']:.1f}: {row['source']} {_s(row['first_request_s'])} / "
                      f"{_s(row['stored_s'])}" + ("" if row["lead_id"] else f" [{row['status'] or row['error']}]")
                      for row in fresh["leads"]))


def report(figures: dict[str, Any]) -> None:
    cfg = figures["config"]
    for name, mode in figures["modes"].items():
        srcs = mode["sources"]
        cols = list(srcs)
        rows: list[list[Any]] = [
            ["leads in the case", *(fmt(srcs[n]["leads"]) for n in cols)],
            ["nginx site-wide / per-address r/s", *(f"{srcs[n]['site_rate_per_s']:g}/{srcs[n]['client_rate_per_s']:g}"
                                                    for n in cols)],
            ["ceiling (r/s)", *(f"{srcs[n]['ceiling_per_s']:g}" for n in cols)],
            ["concurrency", *(fmt(srcs[n]["concurrency"]) for n in cols)],
            ["bound = 1.5 x N / ceiling + 10 (s)", *(_s(srcs[n]["bound_s"]) for n in cols)],
            ["202 -> first request at nginx (s)", *(_s(srcs[n]["first_request_after_202_s"]) for n in cols)],
            ["202 -> first lead stored (s)", *(cell_text(srcs[n]["completion_s"]["first"]) for n in cols)],
            ["202 -> p50 stored (s)", *(cell_text(srcs[n]["completion_s"]["p50"]) for n in cols)],
            ["202 -> p95 stored (s)", *(cell_text(srcs[n]["completion_s"]["p95"]) for n in cols)],
            ["202 -> all stored (s)", *(cell_text(srcs[n]["completion_s"]["all"]) for n in cols)],
            ["bound / all (goal >= 1)", *(ratio_text(srcs[n]["bound_over_all"]) for n in cols)],
            ["stored / failed / unsettled", *(f"{srcs[n]['completion_s']['stored']}/{srcs[n]['failed']}/"
                                              f"{srcs[n]['leads'] - srcs[n]['completion_s']['stored'] - srcs[n]['failed']}"
                                              for n in cols)],
            ["OK/s while served (nginx)", *(fmt(srcs[n]["ok_per_s"]) for n in cols)],
            ["429s at nginx", *(fmt(srcs[n]["refused_429"]) for n in cols)],
            ["Dagster runs for the case", *(fmt(srcs[n]["case_runs"]) for n in cols)],
            ["leads per run (leads: runs)", *(", ".join(f"{k}: {v}" for k, v in srcs[n]["leads_per_run"].items()) or "-"
                                              for n in cols)],
            ["202 -> first / last run created (s)", *(f"{_s(srcs[n]['first_run_created_after_202_s'])} / "
                                                      f"{_s(srcs[n]['last_run_created_after_202_s'])}" for n in cols)],
            ["goal (all within the bound)", *(srcs[n]["goal"] for n in cols)],
        ]
        print_table(f"Mode {name}: one delivery of {mode['leads']} leads ({PRIORITY}) to {len(cols)} source(s), "
                    f"{cfg['identities']} identities via tinyproxy; waited {mode['waited_s']:.0f} s after the 202 "
                    f"({'every lead settled' if mode['settled'] else 'gave up: unsettled leads are lower bounds'})",
                    ["", *cols], rows)
        others = {n: srcs[n]["other_runs"] for n in cols if srcs[n]["other_runs"]}
        if others:
            print(f"  [{name}] other runs of the measured sources (not the case's): {json.dumps(others)}")
        roles = mode["cpu"]["roles_s"]
        print(f"  [{name}] CPU s from the 202 to the end: " + ", ".join(f"{k} {v:.1f}" for k, v in roles.items()
                                                                         if v >= 0.05))
        if mode.get("fresh"):
            report_fresh(name, mode["fresh"], mode["leads"])
    engine = figures.get("engine")
    names = list(figures["modes"])
    cpu_rows: list[list[Any]] = [
        ["CPU window (s)", *(_s(figures["modes"][n]["cpu"]["window_s"]) for n in names), _s(engine and engine["wall_s"])],
        ["collections stored in it (all sources)", *(fmt(figures["modes"][n]["cpu"]["stored_in_window"]) for n in names),
         fmt(engine and engine["collected"])],
        ["fleet CPU: Dagster + intake (s)", *(_s(figures["modes"][n]["cpu"]["fleet_cpu_s"]) for n in names),
         _s(engine and engine["cpu_s"])],
        ["whole machine, cores busy", *(fmt(figures["modes"][n]["cpu"]["machine_cores_busy"]) for n in names), "-"],
        ["CPU per collection (ms)", *(_ms(figures["modes"][n]["cpu"]["fleet_cpu_per_collection_s"]) for n in names),
         _ms(engine and engine["cpu_per_collection_s"])],
        ["Postgres server CPU per collection (ms)",
         *(_ms(figures["modes"][n]["cpu"]["postgres_cpu_per_collection_s"]) for n in names), "-"],
        [f"fleet / engine CPU per collection (goal <= {GOAL_CPU_FACTOR:g})",
         *(fmt(figures["modes"][n]["cpu"].get("factor")) for n in names), "1" if engine else "-"],
        ["goal", *(figures["modes"][n]["cpu"].get("goal", "-") for n in names), "-"],
    ]
    print_table("CPU per collection: the fleet (daemon, code server, run workers, intake) from the 202 until every "
                "lead settled, vs the engine alone", ["", *names, "engine"], cpu_rows)
    if engine:
        print(f"\n  engine alone: {engine['collected']} collections of {engine['leads']} leads in "
              f"{engine['wall_s']:.0f} s, {engine['cpu_s']:.1f} CPU s; OK/s {fmt(engine['ok_per_s'])} of "
              f"{engine['ceiling_per_s']:g}, 429s {engine['refused_429']}")
    print("\n  Times: from the intake's 202 to each lead's `collections.last_success_at`; `>x`: the lead was not "
          "stored when the bench gave up, x is a lower bound (and bound / all `<x` an upper bound). Fresh leads: "
          "from each one's own 202 to its first request's arrival at nginx and to its storing; `-`: none by the end.")


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: one, four (default both)")
    parser.add_argument("--leads", type=int, default=DEFAULT_LEADS,
                        help=f"leads in `one`'s case (default {DEFAULT_LEADS})")
    parser.add_argument("--four-leads", type=int, default=DEFAULT_FOUR_LEADS,
                        help=f"leads in `four`'s case (default {DEFAULT_FOUR_LEADS})")
    parser.add_argument("--identities", type=int, default=DEFAULT_IDENTITIES,
                        help=f"identities, one tinyproxy each (default {DEFAULT_IDENTITIES})")
    parser.add_argument("--site-rate", type=float, default=DEFAULT_SITE_RATE,
                        help=f"`one`: nginx's site-wide rate, r/s (default {DEFAULT_SITE_RATE:g})")
    parser.add_argument("--client-rate", type=float, default=DEFAULT_CLIENT_RATE,
                        help=f"`one`: nginx's per-address rate, r/s (default {DEFAULT_CLIENT_RATE:g})")
    parser.add_argument("--fresh", type=int, default=DEFAULT_FRESH,
                        help=f"`one`: fresh single-lead deliveries sent while the case is in flight, half for "
                             f"`{SOURCE}` and half for `{CALM}` (default {DEFAULT_FRESH}; 0: none, and no `{CALM}`)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help=f"`one`'s source concurrency (collections in flight per run; default "
                             f"{DEFAULT_CONCURRENCY}); `four` scales it by each source's rate over `one`'s site rate")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"give up waiting this long after the 202 (default {DEFAULT_TIMEOUT_S:g}); unsettled "
                             "leads count as lower bounds")
    parser.add_argument("--engine-s", type=float, default=DEFAULT_ENGINE_S,
                        help=f"the engine-alone phase: the ceiling's worth of leads of this many seconds "
                             f"(default {DEFAULT_ENGINE_S:g}; 0 skips it)")
    parser.add_argument("--postgres", action="store_true",
                        help="also run each mode with the state store and Dagster's storage on Postgres "
                             "(INVESTIGATIONS_BENCH_POSTGRES_URL, else the test server)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, stores) after the run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help="where the JSON goes (default bench/results)")
    args = parser.parse_args(argv)
    args.mode_names = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.mode_names or any(m not in MODES for m in args.mode_names):
        parser.error(f"--modes: pick from {', '.join(MODES)}")
    if args.leads < 1 or args.four_leads < 1 or args.identities < 1 or args.timeout_s <= 0:
        parser.error("--leads, --four-leads and --identities must be at least 1, --timeout-s above 0")
    if args.fresh < 0:
        parser.error("--fresh must be 0 or more")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the bench through its `finally` blocks, so no fleet process outlives it.
    signal.signal(signal.SIGTERM, _interrupt)
    modes = [Mode(name, args.leads if name == "one" else args.four_leads, mode_setups(name, args),
                  fresh=args.fresh if name == "one" else 0,
                  calm=calm_setup(args) if name == "one" and args.fresh else None)
             for name in args.mode_names]
    if args.postgres:
        modes += [replace(mode, name=f"{mode.name}-pg", postgres=True) for mode in list(modes)]
    figures: dict[str, Any] = {
        "bench": NAME,
        "config": {"modes": [m.name for m in modes], "leads": args.leads, "four_leads": args.four_leads,
                   "identities": args.identities, "site_rate": args.site_rate, "client_rate": args.client_rate,
                   "site_burst": SITE_BURST, "client_burst": CLIENT_BURST, "four_rates": list(FOUR_RATES),
                   "concurrency": args.concurrency, "priority": PRIORITY, "timeout_s": args.timeout_s,
                   "fresh": args.fresh, "calm_rate": CALM_RATE if args.fresh else None,
                   "fresh_window": f"uniform over [{FRESH_FROM_S:g} s, {FRESH_SPREAD:g} x leads / ceiling] after "
                                   "the case's 202",
                   "goal_fresh_first_request_p95_s": GOAL_FRESH_P95_S,
                   "engine_s": args.engine_s, "postgres": args.postgres, "seed": args.seed,
                   "bound": f"{BOUND_FACTOR:g} x leads / ceiling + {BOUND_SLACK_S:g} s",
                   "goal_cpu_factor": GOAL_CPU_FACTOR},
        "engine_version": engine_digest(), "host_before": host_load(), "modes": {}, "engine": None}
    try:
        with bench_workdir("bench-case-", keep=args.keep) as workdir:
            for mode in modes:
                print(f"\n--- {mode.name}: a {mode.leads}-lead case to "
                      f"{', '.join(f'{s.name} ({s.ceiling(args.identities):g} r/s)' for s in mode.sources)} ---", flush=True)
                figures["modes"][mode.name] = run_mode(mode, args, workdir)
            if args.engine_s > 0:
                print("\n--- the engine alone, on `one`'s target ---", flush=True)
                figures["engine"] = run_engine_alone(args, workdir)
    except ToolMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    engine_per = (figures["engine"] or {}).get("cpu_per_collection_s")
    for mode_figures in figures["modes"].values():
        cpu = mode_figures["cpu"]
        per = cpu["fleet_cpu_per_collection_s"]
        cpu["engine_cpu_per_collection_s"] = engine_per
        cpu["factor"] = per / engine_per if per and engine_per else None
        cpu["goal"] = "-" if cpu["factor"] is None else ("met" if cpu["factor"] <= GOAL_CPU_FACTOR else "NOT met")
    figures["goals"] = {name: {"within_bound": m["goal"], "cpu": m["cpu"]["goal"],
                               **({"fresh_first_request_p95": {src: v["goal_first_request_p95"]
                                                               for src, v in m["fresh"]["sources"].items()}}
                                  if m.get("fresh") else {})}
                        for name, m in figures["modes"].items()}
    figures["host_after"] = host_load()
    report(figures)
    path = write_results(NAME, figures, args.results_dir)
    print(f"\nfigures: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
