"""The `investigations` command: run the fleet's services and look at what it knows."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from investigations.config import ConfigError, Settings
from investigations.intake.leads import Lead, LeadError, lead_id_of, normalize_lead
from investigations.sources.specs import SpecError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_filters(args)
        return int(args.func(args) or 0)
    except KeyError as exc:  # str() of a KeyError is its repr; the message is its argument
        print(f"investigations: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except (SpecError, ConfigError, LeadError) as exc:
        print(f"investigations: {exc}", file=sys.stderr)
        return 2


def _check_filters(args: argparse.Namespace) -> None:
    """Every `--source`, `--reason` and `--lead` names something that exists (KeyError, naming the
    valid choices, if not); a `--lead` given as kind:value becomes its id."""
    if getattr(args, "source", None) is not None:
        from investigations.sources.catalog import load_catalog

        load_catalog(Settings.from_env().sources_path).get(args.source)
    reason = getattr(args, "reason", None)
    if reason is not None:
        from investigations.collection.collect import DEAD_LETTER_REASONS

        if reason not in DEAD_LETTER_REASONS:
            raise KeyError(f"unknown reason {reason!r} (known: {', '.join(DEAD_LETTER_REASONS)})")
    lead = getattr(args, "lead", None)
    if lead is not None:
        args.lead = lead_id_of(lead)


def _above_zero(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


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
    dlq_requeue.add_argument("--lead", help="a lead id, or kind:value (e.g. domain:example.com)")
    dlq_requeue.add_argument("--all", action="store_true", help="requeue every dead letter")
    dlq_requeue.add_argument("--priority", default="recurring", choices=["interactive", "recurring", "backfill"])
    dlq_requeue.set_defaults(func=_dlq_requeue)

    records = sub.add_parser("records", help="query collected records across sources and leads (DuckDB over Parquet)")
    records.add_argument("--source", help="only this source")
    records.add_argument("--lead", help="a lead id, or kind:value (e.g. domain:example.com)")
    records.add_argument("--contains", help="only records whose fields contain this text")
    records.add_argument("--limit", type=_above_zero(int), default=50)
    records.add_argument("--captures", action="store_true",
                         help="show each record's capture: WARC record id, file@offset, payload sha256, identity")
    records.add_argument("--json", action="store_true")
    records.set_defaults(func=_records)

    export = sub.add_parser("export", help="write a case's records, the WARC captures they point at and a "
                                           "datapackage.json manifest into a new folder")
    export.add_argument("--case", required=True, help="the case id")
    export.add_argument("folder", type=Path, help="where to write the package (new or empty)")
    export.set_defaults(func=_export)

    verify = sub.add_parser("verify", help="check an exported package: every file against the manifest, every "
                                           "record's payload against its WARC record (exit 1 on any mismatch)")
    verify.add_argument("folder", type=Path)
    verify.set_defaults(func=_verify)

    fleet = sub.add_parser("fleet", help="per source: health, throughput, error rates, freshness, identities, spend")
    fleet.add_argument("--hours", type=_above_zero(float), default=24.0, help="requests and outcomes over this many hours")
    fleet.add_argument("--window-min", type=float, default=None,
                       help="rates, latency and throughput over this many minutes (default 15)")
    fleet.add_argument("--json", action="store_true", help="the figures as JSON (one line per refresh with --watch)")
    fleet.add_argument("--watch", type=float, nargs="?", const=5.0, default=None, metavar="SECONDS",
                       help="refresh every SECONDS (default 5) until Ctrl-C")
    fleet.set_defaults(func=_fleet)

    identities = sub.add_parser("identities", help="the identity pool: state per source, lease holder, rests, failures")
    identities.add_argument("--source", help="only this source")
    identities.add_argument("--json", action="store_true")
    identities.set_defaults(func=_identities)
    return parser


def _store(settings: Settings):  # noqa: ANN202 - imported lazily to keep `--help` fast
    from investigations.store import StateStore

    return StateStore.from_url(settings.database_url)


def _up(args: argparse.Namespace) -> int:
    from investigations.demo.fleet import run_demo_fleet

    return run_demo_fleet(Path.cwd(), send_demo=not args.no_demo)


def _sandbox(args: argparse.Namespace) -> int:
    from investigations.sandbox import SandboxConfig, serve

    port = args.port or Settings.from_env().sandbox_port
    serve(host=args.host, port=port, config=SandboxConfig(seed=args.seed))
    return 0


def _intake(args: argparse.Namespace) -> int:
    from investigations.intake.app import serve

    settings = Settings.from_env()
    serve(settings, host=args.host, port=args.port or settings.intake_port)
    return 0


def _demo_case(args: argparse.Namespace) -> int:
    from investigations.demo.case import DEMO_CASE_ID, demo_body, send_case
    from investigations.demo.fleet import DEMO_WEBHOOK_SECRET

    settings = Settings.from_env()
    # `make run` starts its intake with the demo secret unless one is set: sign with the same.
    secret = settings.webhook_secret or DEMO_WEBHOOK_SECRET
    url = args.intake_url or f"http://127.0.0.1:{settings.intake_port}"
    answer = send_case(url, secret, demo_body(args.case_id or DEMO_CASE_ID))
    print(f"HTTP {answer.status_code}: {answer.text}")
    return 0 if answer.is_success else 1


def _printed_plainly(args: argparse.Namespace, rows: Sequence[Any], *, none: str) -> bool:
    """`rows` as JSON under --json, or `none` when there are no rows: True when that was the whole answer
    (the caller's table is not wanted)."""
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return True
    if not rows:
        print(none)
        return True
    return False


def _leads_list(args: argparse.Namespace) -> int:
    rows = _store(Settings.from_env()).leads_overview()
    if _printed_plainly(args, rows, none="no leads"):
        return 0
    table = _table("lead", "kind", "value", "cases", "source", "last outcome", "records", "last with records")
    for row in rows:
        collections = sorted(row["collections"].items()) or [(None, None)]
        for n, (source, coll) in enumerate(collections):
            head = [row["lead_id"], row["kind"], row["value"], ", ".join(row["cases"]) or "-"] if n == 0 else [""] * 4
            if coll is None:
                table.add_row(*head, "-", "not collected", "", "")
                continue
            # An empty answer is an outcome, not a success: only a collection with records counts.
            found = coll["records"] and coll["outcome"] == "ok" and coll["last_success_at"]
            table.add_row(*head, source, coll["outcome"], str(coll["records"]),
                          coll["last_success_at"].isoformat(timespec="seconds") if found else "never")
    _console().print(table)
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
    cases = _store(Settings.from_env()).cases_overview()
    if not cases:
        print("no cases")
        return 0
    table = _table("case", "status", "leads", "since")
    for case in cases:
        table.add_row(case["case_id"], case["status"], str(case["leads"]), case["created_at"].isoformat(timespec="seconds"))
    _console().print(table)
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
    from investigations.sources.catalog import load_catalog

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
    as_json = [{**vars(letter), "requeued": (letter.source, letter.lead_id) in requeued} for letter in letters]
    if _printed_plainly(args, as_json, none="no dead letters"):
        return 0
    table = _table("source", "lead", "reason", "status", "attempts", "last seen", "requeued", "last error")
    for letter in letters:
        table.add_row(letter.source, letter.lead_id, letter.reason_group, str(letter.last_status or "-"),
                      str(letter.attempts), letter.last_seen.isoformat(timespec="seconds"),
                      "yes" if (letter.source, letter.lead_id) in requeued else "", letter.last_error or "")
    _console().print(table)
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
    from investigations.evidence.records import query_records

    rows = query_records(Settings.from_env().records_dir, source=args.source, lead_id=args.lead,
                         contains=args.contains, limit=args.limit)
    if _printed_plainly(args, rows, none="no records"):
        return 0
    if args.captures:
        # The file names the lead; the digest is cut to its first 16 hex digits (whole in --json).
        table = _table("source", "record", "fetched", "capture", "warc file@offset", "payload sha256",
                       "identity", "parser")
        for name in ("capture", "warc file@offset"):  # copied whole to look a capture up: never folded
            next(c for c in table.columns if c.header == name).no_wrap = True
        for row in rows:
            where = f"{row['warc_file']}@{row['warc_offset']}" if row["warc_file"] else "-"
            digest = row["payload_sha256"][:16] if row["payload_sha256"] else "-"
            table.add_row(row["source"], row["record_key"], f"{row['fetched_at']:%Y-%m-%d %H:%M}",
                          row["capture_id"] or "-", where, digest, row["identity_id"] or "-",
                          row["parser_version"] or "-")
        _console().print(table, markup=False, highlight=False)
        return 0
    table = _table("source", "lead", "record", "fetched", "fields")
    for row in rows:
        table.add_row(row["source"], row["lead_id"], row["record_key"], f"{row['fetched_at']:%Y-%m-%d %H:%M}",
                      row["fields"])
    _console().print(table)
    return 0


def _export(args: argparse.Namespace) -> int:
    from investigations.evidence.casepackage import MANIFEST, export_case

    settings = Settings.from_env()
    try:
        done = export_case(_store(settings), settings.data_dir, args.case, args.folder)
    except (FileExistsError, FileNotFoundError) as exc:
        print(f"investigations: {exc}", file=sys.stderr)
        return 2
    print(f"exported case {args.case}: {done.leads} lead(s), {done.records} record(s) in {done.record_files} "
          f"file(s), {done.warc_files} WARC file(s), {done.bytes} bytes; manifest {done.folder / MANIFEST}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from investigations.evidence.casepackage import verify_package

    result = verify_package(args.folder)
    if not result.ok:
        for problem in result.problems:
            print(f"MISMATCH {problem}", file=sys.stderr)
        print(f"investigations: {args.folder} FAILED verification: {len(result.problems)} problem(s) in "
              f"{result.files} file(s), {result.records} record(s)", file=sys.stderr)
        return 1
    print(f"verified {result.files} file(s) and {result.records} record(s) against their WARC captures: all match")
    return 0


def _fleet(args: argparse.Namespace) -> int:
    from investigations.fleet.stats import DEFAULT_WINDOW_S

    if args.window_min is None:
        args.window_min = DEFAULT_WINDOW_S / 60
    if args.window_min <= 0:
        print("investigations: --window-min must be above 0", file=sys.stderr)
        return 2
    if args.watch is None:
        _print_fleet(args)
        return 0
    if args.watch <= 0:
        print("investigations: --watch takes a number of seconds above 0", file=sys.stderr)
        return 2
    try:
        while True:
            if not args.json:
                _console().clear()
            _print_fleet(args)
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _fleet_rows(settings: Settings, *, hours: float, window_s: float) -> list[dict[str, Any]]:
    """Per source: the fleet figures (investigations.fleet.stats), the request outcomes over `hours`,
    the queue, the circuit and the lane's current rate."""
    from investigations.fleet.stats import fleet_figures
    from investigations.pacing import Circuits, GapSampler, RateLanes
    from investigations.pacing.aimd import NEVER_CUT_S
    from investigations.sources.catalog import load_catalog
    from investigations.store import QUEUE_DEPTH_KEYS

    store = _store(settings)
    catalog = load_catalog(settings.sources_path)
    now = datetime.now(UTC)
    summary = {row["source"]: row for row in store.fleet_summary(since=now - timedelta(hours=hours))}
    depths = store.queue_depths(now=now)
    circuits = {source: state.state for source, state in Circuits(store).all_states().items()}
    lanes = {lane.lane: lane for lane in RateLanes(store, sampler=GapSampler(random.Random())).all_states()}
    figures = {f.source: f for f in fleet_figures(store, catalog, now=now, window_s=window_s, circuits=circuits,
                                                   data_dir=settings.data_dir)}
    rows = []
    for spec in catalog.sources:
        stats = summary.get(spec.name, {"requests": 0, "outcomes": {}, "latency_ms": 0.0, "last_at": None})
        lane = lanes.get(f"source:{spec.name}")
        rows.append({
            **figures[spec.name].as_dict(),
            "requests": stats["requests"],
            "window_requests": figures[spec.name].requests,
            "outcomes": stats["outcomes"],
            "mean_latency_ms": round(stats["latency_ms"], 1),
            "last_request_at": stats["last_at"],
            "queue": depths.get(spec.name, dict.fromkeys(QUEUE_DEPTH_KEYS, 0)),
            "rate_per_s": round(spec.rate.source_per_s * (lane.rate_factor if lane else 1.0), 3),
            "configured_rate_per_s": spec.rate.source_per_s,
            # The rate the source last throttled at, once it has: the lane settles just under it.
            "ceiling_rate_per_s": (round(spec.rate.source_per_s * lane.ceiling_factor, 3)
                                   if lane and lane.last_cut_s != NEVER_CUT_S else None),
        })
    return rows


def _print_fleet(args: argparse.Namespace) -> None:
    rows = _fleet_rows(Settings.from_env(), hours=args.hours, window_s=args.window_min * 60)
    if args.json:
        print(json.dumps(rows, default=str, indent=None if args.watch else 2), flush=True)
        return
    from rich.table import Table

    table = Table(title=f"fleet: rates over {args.window_min:g} min, requests over {args.hours:g} h",
                  title_justify="left", box=None, header_style="bold")
    for name, justify in (("source", "left"), ("health", "left"), ("backlog", "right"), ("in flight", "right"),
                          ("req/min", "right"), ("rec/min", "right"), ("retry", "right"), ("fail", "right"),
                          ("429/block", "right"), ("empty", "right"), ("p50/p95 ms", "right"), ("fresh", "right"),
                          ("stalest", "right"), ("ids a/l/r/x", "right"), ("dead", "right"), ("spend/budget $", "right"),
                          ("rec/$", "right"), ("circuit", "left"), ("rate/s", "right"), ("requests", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            row["source"], f"[{_HEALTH_STYLE.get(row['health'], 'red')}]{row['health']}[/]",
            str(row["backlog"]), str(row["in_flight"]), f"{row['requests_per_min']:.1f}", f"{row['records_per_min']:.1f}",
            _pct(row["retry_rate"]), _pct(row["failure_rate"]), _pct(row["block_rate"]), _pct(row["empty_rate"]),
            f"{_num(row['latency_p50_ms'])}/{_num(row['latency_p95_ms'])}",
            "-" if row["fresh_share"] is None else f"{row['fresh']}/{row['monitored']}",
            _age(row["stalest_age_s"]),
            _identity_counts(row),
            str(row["dead_letters"]),
            f"{row['spend_today_usd']:.2f}/" + (f"{row['daily_budget_usd']:g}" if row["daily_budget_usd"] else "-"),
            _num(row["records_per_usd"]), row["circuit"],
            f"{row['rate_per_s']:g}/{row['configured_rate_per_s']:g}"
            + ("" if row["ceiling_rate_per_s"] is None else f" (ceiling {row['ceiling_rate_per_s']:g})"),
            str(row["requests"]),
        )
    console = _console()
    console.print(table)
    for row in rows:
        if row["health_reason"] and row["health"] != "idle":
            console.print(f"  {row['source']}: {row['health']}: {row['health_reason']}", highlight=False)
    for row in rows:
        for reason, count in sorted(row["parked"].items(), key=lambda item: -item[1]):
            console.print(f"  {row['source']}: {count} parked: {reason}", highlight=False, markup=False)


_HEALTH_STYLE = {"ok": "green", "idle": "dim", "stale": "yellow", "stalled": "yellow", "over_budget": "yellow"}


def _table(*columns: str):  # noqa: ANN202 - rich is imported lazily to keep `--help` fast
    """A table whose long values wrap within their column instead of being cut."""
    from rich.table import Table

    table = Table(*columns, header_style="bold", show_edge=False)
    for column in table.columns:
        column.overflow = "fold"
    return table


def _console():  # noqa: ANN202 - rich is imported lazily to keep `--help` fast
    from rich.console import Console

    # Piped output is not wrapped at 80 columns: a script reading the table gets whole rows.
    return Console(width=None if sys.stdout.isatty() else 240)


def _identity_counts(row: dict[str, Any]) -> str:
    counts = [row[f"identities_{state}"] for state in ("available", "leased", "resting", "retired")]
    # No registered pool: requests go out directly, as the one `direct` identity.
    return "/".join(map(str, counts)) if any(counts) else "direct"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _identities(args: argparse.Namespace) -> int:
    from investigations.fleet.stats import read_identity_standings

    now = datetime.now(UTC)
    rows = [row for row in read_identity_standings(_store(Settings.from_env()), now=now)
            if args.source is None or row.source in (args.source, None)]
    if _printed_plainly(args, [vars(row) for row in rows],
                        none="no identities registered (the pool registers the identities file at its first "
                             "lease); without INVESTIGATIONS_IDENTITIES requests go out directly as `direct`"):
        return 0
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for name in ("identity", "tier", "range", "source", "state", "leased by", "rest until", "score", "rests",
                 "failures 24h"):
        table.add_column(name)
    for row in rows:
        rest = "-"
        if row.rest_until_s is not None:
            until = datetime.fromtimestamp(row.rest_until_s, UTC)
            rest = f"{until.isoformat(timespec='seconds')} (in {_age(row.rest_until_s - now.timestamp())})"
        table.add_row(row.identity_id, row.tier, row.range, row.source or "-", row.state, row.leased_by or "-", rest,
                      f"{row.score:g}", str(row.rests), str(row.failures))
    _console().print(table, markup=False, highlight=False)
    return 0
