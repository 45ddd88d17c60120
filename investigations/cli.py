"""The `investigations` command: run the fleet's services and look at what it knows."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from investigations.config import ConfigError, Settings
from investigations.leads import LEAD_KINDS, Lead, LeadError, normalize_lead
from investigations.specs import SpecError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (SpecError, ConfigError, LeadError, KeyError) as exc:
        print(f"investigations: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="investigations", description=__doc__)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the demo fleet: sandbox web, intake, Dagster UI and daemon")
    up.add_argument("--no-demo", action="store_true", help="do not send the demo case")
    up.set_defaults(func=_up)

    sandbox = sub.add_parser("sandbox", help="serve the sandbox web (fake sources with known behaviour)")
    sandbox.add_argument("--host", default="127.0.0.1")
    sandbox.add_argument("--port", type=int, default=None, help="default: INVESTIGATIONS_SANDBOX_PORT or 8800")
    sandbox.add_argument("--seed", type=int, default=7)
    sandbox.set_defaults(func=_sandbox)

    intake = sub.add_parser("intake", help="serve the webhook intake (POST /v1/leads)")
    intake.add_argument("--host", default="127.0.0.1")
    intake.add_argument("--port", type=int, default=None, help="default: INVESTIGATIONS_INTAKE_PORT or 8700")
    intake.set_defaults(func=_intake)

    demo = sub.add_parser("demo-case", help="send the signed demo case to a running intake")
    demo.add_argument("--intake-url", default=None)
    demo.add_argument("--case-id", default=None)
    demo.set_defaults(func=_demo_case)

    leads = sub.add_parser("leads", help="list leads with their cases and last collections, or add one")
    leads_sub = leads.add_subparsers(required=True, metavar="ACTION")
    leads_list = leads_sub.add_parser("list", help="every lead, its cases and last success per source")
    leads_list.add_argument("--json", action="store_true")
    leads_list.set_defaults(func=_leads_list)
    leads_add = leads_sub.add_parser("add", help="register a lead, or every lead of a file, in a case "
                                     "(no collection is queued)")
    leads_add.add_argument("kind", nargs="?")
    leads_add.add_argument("value", nargs="?")
    leads_add.add_argument("--file", type=Path, help="one lead a line, `KIND VALUE` (blank lines and # comments "
                           "skipped; - reads stdin), registered in one transaction")
    leads_add.add_argument("--case", required=True)
    leads_add.set_defaults(func=_leads_add)

    cases = sub.add_parser("cases", help="list cases, or close / re-open one (closed cases are not monitored)")
    cases_sub = cases.add_subparsers(required=True, metavar="ACTION")
    cases_sub.add_parser("list", help="cases with their status and lead count").set_defaults(func=_cases_list)
    for action, status in (("close", "closed"), ("reopen", "active")):
        case_action = cases_sub.add_parser(action, help=f"mark a case {status}")
        case_action.add_argument("case_id")
        case_action.set_defaults(func=_case_status, status=status)

    backfill = sub.add_parser("backfill", help="queue a source over every lead it takes, as low-priority batches")
    backfill.add_argument("--source", required=True)
    backfill.set_defaults(func=_backfill)

    dlq = sub.add_parser("dlq", help="dead letters: collections that gave up")
    dlq_sub = dlq.add_subparsers(required=True, metavar="ACTION")
    dlq_list = dlq_sub.add_parser("list", help="list dead letters")
    dlq_list.add_argument("--source")
    dlq_list.add_argument("--reason")
    dlq_list.add_argument("--json", action="store_true")
    dlq_list.set_defaults(func=_dlq_list)
    dlq_requeue = dlq_sub.add_parser(
        "requeue", help="queue matching dead letters for another collection (idempotent: twice queues once)"
    )
    dlq_requeue.add_argument("--source")
    dlq_requeue.add_argument("--reason")
    dlq_requeue.add_argument("--lead", help="a lead id")
    dlq_requeue.add_argument("--all", action="store_true", help="requeue every dead letter")
    dlq_requeue.add_argument("--priority", default="recurring", choices=["interactive", "recurring", "backfill"])
    dlq_requeue.set_defaults(func=_dlq_requeue)

    records = sub.add_parser("records", help="query collected records across sources and leads (DuckDB over Parquet)")
    records.add_argument("--source", help="only this source")
    records.add_argument("--lead", help="a lead id, or kind:value (e.g. domain:example.com)")
    records.add_argument("--contains", help="only records whose fields contain this text")
    records.add_argument("--limit", type=int, default=50)
    records.add_argument("--json", action="store_true")
    records.set_defaults(func=_records)

    fleet = sub.add_parser("fleet", help="per source: requests and outcomes, backlog, circuit, current rate")
    fleet.add_argument("--hours", type=float, default=24.0)
    fleet.add_argument("--json", action="store_true")
    fleet.set_defaults(func=_fleet)
    return parser


def _store(settings: Settings):  # noqa: ANN202 - imported lazily to keep `--help` fast
    from investigations.store import StateStore

    return StateStore.from_url(settings.database_url)


def _up(args: argparse.Namespace) -> int:
    from investigations.devfleet import run_demo_fleet

    return run_demo_fleet(Path.cwd(), send_demo=not args.no_demo)


def _sandbox(args: argparse.Namespace) -> int:
    from investigations.sandbox import SandboxConfig, serve

    port = args.port or Settings.from_env().sandbox_port
    serve(host=args.host, port=port, config=SandboxConfig(seed=args.seed))
    return 0


def _intake(args: argparse.Namespace) -> int:
    from investigations.intake import serve

    settings = Settings.from_env()
    serve(settings, host=args.host, port=args.port or settings.intake_port)
    return 0


def _demo_case(args: argparse.Namespace) -> int:
    from investigations.demo import DEMO_CASE_ID, demo_body, send_case

    settings = Settings.from_env()
    if not settings.webhook_secret:
        raise ConfigError("INVESTIGATIONS_WEBHOOK_SECRET is not set")
    url = args.intake_url or f"http://127.0.0.1:{settings.intake_port}"
    answer = send_case(url, settings.webhook_secret, demo_body(args.case_id or DEMO_CASE_ID))
    print(f"HTTP {answer.status_code}: {answer.text}")
    return 0 if answer.is_success else 1


def _leads_list(args: argparse.Namespace) -> int:
    rows = _store(Settings.from_env()).leads_overview()
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return 0
    for row in rows:
        print(f"{row['lead_id']}  {row['kind']:<8} {row['value']}  cases: {', '.join(row['cases']) or '-'}")
        for source, coll in sorted(row["collections"].items()):
            success = coll["last_success_at"].isoformat(timespec="seconds") if coll["last_success_at"] else "never"
            print(f"    {source:<12} {coll['outcome']:<7} {coll['records']:>4} records  last success {success}")
    return 0


def _leads_add(args: argparse.Namespace) -> int:
    one_lead = args.kind is not None and args.value is not None
    if one_lead == (args.file is not None) or (args.file is not None and args.kind is not None):
        print("investigations: leads add takes KIND VALUE or --file PATH", file=sys.stderr)
        return 2
    if args.file is None:
        lead = normalize_lead(args.kind, args.value)
        _store(Settings.from_env()).add_lead(lead, case_id=args.case)
        print(lead.id)
        return 0
    leads = read_leads_file(args.file)
    added = _store(Settings.from_env()).add_leads(leads, case_id=args.case)
    print(f"registered {added} lead(s) in case {args.case}")
    return 0


def read_leads_file(path: Path) -> list[Lead]:
    """Leads of a file, one `KIND VALUE` a line; every bad line is reported with its number, and
    nothing is registered unless every line is good."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    leads, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kind, _, value = line.partition(" ")
        try:
            leads.append(normalize_lead(kind, value.strip()))
        except LeadError as exc:
            problems.append(f"{path}:{number}: {exc}")
    if problems:
        raise LeadError("; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))
    return leads


def _cases_list(args: argparse.Namespace) -> int:
    for case in _store(Settings.from_env()).cases_overview():
        print(f"{case['case_id']:<32} {case['status']:<7} {case['leads']:>5} lead(s)  "
              f"since {case['created_at'].isoformat(timespec='seconds')}")
    return 0


def _case_status(args: argparse.Namespace) -> int:
    try:
        changed = _store(Settings.from_env()).set_case_status(args.case_id, args.status)
    except KeyError as exc:
        print(f"investigations: {exc.args[0]}", file=sys.stderr)
        return 2
    print(f"case {args.case_id} is {args.status}" + ("" if changed else " (unchanged)"))
    return 0


def _backfill(args: argparse.Namespace) -> int:
    from investigations.catalog import load_catalog

    settings = Settings.from_env()
    spec = load_catalog(settings.sources_path).get(args.source)
    store = _store(settings)
    leads = store.all_lead_ids(kinds=spec.lead_kinds)
    # One origin per day: running the same backfill twice in a day queues it once.
    origin = f"backfill:{datetime.now(UTC).date().isoformat()}"
    queued = store.enqueue([(spec.name, lead) for lead in leads], origin=origin, priority_class="backfill")
    print(f"queued {queued} of {len(leads)} lead(s) for {spec.name} as backfill ({origin}); they run in batches "
          "after interactive and recurring work")
    return 0


def _dlq_list(args: argparse.Namespace) -> int:
    store = _store(Settings.from_env())
    letters = store.dead_letters(source=args.source, reason_group=args.reason)
    requeued = store.requeued_dead_letters()
    if args.json:
        print(json.dumps([{**vars(letter), "requeued": (letter.source, letter.lead_id) in requeued}
                          for letter in letters], default=str, indent=2))
        return 0
    if not letters:
        print("no dead letters")
    for letter in letters:
        mark = "  [requeued]" if (letter.source, letter.lead_id) in requeued else ""
        print(
            f"{letter.source:<12} {letter.lead_id}  {letter.reason_group:<10} status {letter.last_status} "
            f"attempts {letter.attempts}  last {letter.last_seen.isoformat(timespec='seconds')}  "
            f"{letter.last_error}{mark}"
        )
    return 0


def _dlq_requeue(args: argparse.Namespace) -> int:
    if not (args.all or args.source or args.reason or args.lead):
        print("investigations: say which dead letters to requeue (--source, --reason, --lead) or --all",
              file=sys.stderr)
        return 2
    store = _store(Settings.from_env())
    queued = store.requeue_dead_letters(source=args.source, reason_group=args.reason, lead_id=args.lead,
                                        priority_class=args.priority)
    matching = len(store.dead_letters(source=args.source, reason_group=args.reason, lead_id=args.lead))
    print(f"requeued {len(queued)} of {matching} matching dead letter(s)"
          + (f"; {matching - len(queued)} already queued" if matching > len(queued) else ""))
    for letter in queued:
        print(f"  {letter.source} {letter.lead_id} ({letter.reason_group})")
    return 0


def _records(args: argparse.Namespace) -> int:
    from investigations.records import query_records

    lead_id = args.lead
    kind, colon, value = (lead_id or "").partition(":")
    if colon and kind in LEAD_KINDS:  # lead ids have no colon: this is kind:value
        lead_id = normalize_lead(kind, value).id
    rows = query_records(Settings.from_env().records_dir, source=args.source, lead_id=lead_id,
                         contains=args.contains, limit=args.limit)
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return 0
    if not rows:
        print("no records")
    for row in rows:
        print(f"{row['source']:<10} {row['lead_id']}  {row['record_key']:<18} {row['fetched_at']:%Y-%m-%d %H:%M}  "
              f"{row['fields'][:100]}")
    return 0


def _fleet(args: argparse.Namespace) -> int:
    from investigations.catalog import load_catalog
    from investigations.pacing import Circuits, GapSampler, RateLanes
    from investigations.pacing.aimd import NEVER_CUT_S
    from investigations.store import QUEUE_DEPTH_KEYS

    settings = Settings.from_env()
    store = _store(settings)
    since = datetime.now(UTC) - timedelta(hours=args.hours)
    summary = {row["source"]: row for row in store.fleet_summary(since=since)}
    depths = store.queue_depths()
    circuits = Circuits(store).all_states()
    lanes = {lane.lane: lane for lane in RateLanes(store, sampler=GapSampler(random.Random())).all_states()}
    rows = []
    for spec in load_catalog(settings.sources_path).sources:
        stats = summary.get(spec.name, {"requests": 0, "outcomes": {}, "latency_ms": 0.0, "last_at": None})
        lane = lanes.get(f"source:{spec.name}")
        circuit = circuits.get(spec.name)
        rows.append({
            "source": spec.name,
            "requests": stats["requests"],
            "outcomes": stats["outcomes"],
            "mean_latency_ms": round(stats["latency_ms"], 1),
            "last_request_at": stats["last_at"],
            "queue": depths.get(spec.name, dict.fromkeys(QUEUE_DEPTH_KEYS, 0)),
            "circuit": circuit.state if circuit else "closed",
            "rate_per_s": round(spec.rate.source_per_s * (lane.rate_factor if lane else 1.0), 3),
            "configured_rate_per_s": spec.rate.source_per_s,
            # The rate the source last throttled at, once it has: the lane settles just under it.
            "ceiling_rate_per_s": (round(spec.rate.source_per_s * lane.ceiling_factor, 3)
                                   if lane and lane.last_cut_s != NEVER_CUT_S else None),
            # Parked collections waiting in the backlog, by why they were parked.
            "parked": store.park_reasons(spec.name),
        })
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return 0
    print(f"{'source':<12} {'requests':>8} {'ok':>6} {'throttled':>9} {'failed':>6}  {'queued':>6} {'waiting':>7} "
          f"{'in flight':>9}  {'circuit':<9} {'rate/s':>13} {'ceiling/s':>9}  last request")
    for row in rows:
        ok = row["outcomes"].get("ok", 0)
        throttled = row["outcomes"].get("throttled", 0)
        last = row["last_request_at"].isoformat(timespec="seconds") if row["last_request_at"] else "-"
        queue = row["queue"]
        rate = f"{row['rate_per_s']:g}/{row['configured_rate_per_s']:g}"
        ceiling = "-" if row["ceiling_rate_per_s"] is None else f"{row['ceiling_rate_per_s']:g}"
        print(f"{row['source']:<12} {row['requests']:>8} {ok:>6} {throttled:>9} {row['requests'] - ok - throttled:>6}  "
              f"{queue['ready']:>6} {queue['waiting']:>7} {queue['dispatched']:>9}  {row['circuit']:<9} {rate:>13} "
              f"{ceiling:>9}  {last}")
    for row in rows:
        for reason, count in sorted(row["parked"].items(), key=lambda item: -item[1]):
            print(f"  {row['source']}: {count} parked: {reason}")
    return 0
