"""The `investigations` command: run the fleet's services and look at what it knows."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from investigations.config import ConfigError, Settings
from investigations.intake.leads import LEAD_KINDS, Lead, LeadError, normalize_lead
from investigations.sources.specs import SpecError

if TYPE_CHECKING:  # rich is imported lazily to keep `--help` fast
    from rich.console import Console
    from rich.table import Table


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
    """Every `--source`, `--reason` and `--lead` names something that exists (KeyError naming the
    valid choices, or LeadError, if not); a `--lead` given as kind:value becomes its id."""
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
        args.lead = _known_lead_id(lead)


_LEAD_ID = re.compile(rf"(?:{'|'.join(LEAD_KINDS)})-[0-9a-f]{{16}}")
_LEAD_FORMS = ("kind:value (e.g. domain:example.com; kinds: " + ", ".join(LEAD_KINDS) + ") or a lead id "
               "as `investigations leads list` shows it (e.g. domain-0123456789abcdef)")


def _known_lead_id(text: str) -> str:
    """The id of the lead a `--lead` names, given as kind:value or as its id. LeadError saying the
    expected form when `text` is neither, or how to list the leads when the state store has no such lead."""
    kind, colon, value = text.partition(":")
    if colon:
        if kind not in LEAD_KINDS:
            raise LeadError(f"--lead {text!r}: unknown lead kind {kind!r}; --lead takes {_LEAD_FORMS}")
        try:
            lead_id = normalize_lead(kind, value).id
        except LeadError as exc:
            raise LeadError(f"--lead {text!r}: {exc}; --lead takes {_LEAD_FORMS}") from None
    elif _LEAD_ID.fullmatch(text):
        lead_id = text
    else:
        raise LeadError(f"--lead {text!r} is not a lead; --lead takes {_LEAD_FORMS}")
    if _store(Settings.from_env()).get_lead(lead_id) is None:
        named = text if text == lead_id else f"{text} ({lead_id})"
        raise LeadError(f"no lead {named} in the state store; `investigations leads list` lists the leads it has")
    return lead_id


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
    leads_list.add_argument("--cadence", action="store_true",
                            help="how often each source looks at each lead: its changes a day, next due, and why")
    leads_list.add_argument("--json", action="store_true")
    leads_list.set_defaults(func=_leads_list)
    leads_runs = leads_sub.add_parser(
        "runs", help="the Dagster runs that collected a lead (batches and UI backfills included), with a link "
        "to the Runs page showing just them")
    leads_runs.add_argument("lead", help="kind:value (domain:example.com) or a lead id")
    leads_runs.add_argument("--source", help="only this source's runs")
    leads_runs.add_argument("--json", action="store_true")
    leads_runs.set_defaults(func=_leads_runs)
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

    changes = sub.add_parser("changes", help="what's new in a case: records added, removed or changed per lead and "
                                             "source, newest last (a lead's first records are shown as first seen)")
    changes.add_argument("--case", required=True, help="the case id (`investigations cases list`)")
    changes.add_argument("--since", help="a duration back from now (30m, 6h, 7d) or an ISO time; default: all")
    changes.add_argument("--json", action="store_true")
    changes.set_defaults(func=_changes)

    records = sub.add_parser("records", help="query collected records across sources and leads (DuckDB over Parquet)")
    records.add_argument("--source", help="only this source")
    records.add_argument("--lead", help="a lead id, or kind:value (e.g. domain:example.com)")
    records.add_argument("--contains", help="only records whose fields contain this text")
    records.add_argument("--limit", type=_above_zero(int), default=50)
    records.add_argument("--captures", action="store_true",
                         help="show each record's capture: WARC record id, file@offset, payload sha256 (hex; the WARC-Payload-Digest is the same hash in base32), identity")
    records.add_argument("--json", action="store_true")
    records.set_defaults(func=_records)

    export = sub.add_parser("export", help="write a case's records, the WARC captures they and its empty answers "
                                           "point at, sources.json (source specs, secrets masked), "
                                           "empty_answers.csv and a datapackage.json manifest into a new folder")
    export.add_argument("--case", required=True, help="the case id")
    export.add_argument("folder", type=Path, help="where to write the package (new or empty)")
    export.add_argument("--sign", action="store_true",
                        help="sign the manifest's digest (datapackage-digest.json) with the key the "
                             "INVESTIGATIONS_SIGNING_KEY setting names (a PEM file), as WACZ signing does")
    export.set_defaults(func=_export)

    verify = sub.add_parser("verify", help="check an exported package: every file against the manifest, every "
                                           "record read again from its WARC capture with its source's adapter, "
                                           "every empty answer's capture (exit 1 on any mismatch)")
    verify.add_argument("folder", type=Path)
    verify.add_argument("--key", type=Path, metavar="PEM",
                        help="the package must be signed by this key (its public half, or the private key's file)")
    verify.set_defaults(func=_verify)

    signing_key = sub.add_parser("signing-key", help="make a signing key for `export --sign` (ECDSA P-384, PEM, "
                                                     "readable by you only) and print its public half and fingerprint")
    signing_key.add_argument("path", type=Path, help="the key file to write (it must not exist yet)")
    signing_key.set_defaults(func=_signing_key)

    fleet = sub.add_parser("fleet", help="per source: health, throughput, error rates, freshness, identities, spend")
    fleet.add_argument("--source", help="only this source")
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
    import httpx

    from investigations.demo.case import DEMO_CASE_ID, demo_body, demo_webhook_id, send_case
    from investigations.demo.fleet import DEMO_WEBHOOK_SECRET

    settings = Settings.from_env()
    # `make run` starts its intake with the demo secret unless one is set: sign with the same.
    secret = settings.webhook_secret or DEMO_WEBHOOK_SECRET
    url = args.intake_url or f"http://127.0.0.1:{settings.intake_port}"
    case_id = args.case_id or DEMO_CASE_ID
    # The same webhook id every time: sending the case again is a redelivery, and queues nothing new.
    webhook_id = demo_webhook_id(case_id)
    try:
        answer = send_case(url, secret, demo_body(case_id), webhook_id=webhook_id)
    except (httpx.UnsupportedProtocol, httpx.InvalidURL):
        print(f"investigations: --intake-url {url!r} is not an http:// or https:// address", file=sys.stderr)
        return 2
    except httpx.TransportError:
        print(f"investigations: the intake at {url} is not answering (start it with `make run` or "
              "`investigations intake`)", file=sys.stderr)
        return 1
    if answer.status_code != 202:
        print(f"investigations: the intake at {url} refused the demo case: HTTP {answer.status_code}: {answer.text}",
              file=sys.stderr)
        return 1
    delivered = answer.json()
    print(f"the intake at {url} took the demo case {case_id} (webhook {webhook_id}): "
          f"{len(delivered['accepted'])} new lead(s)"
          + (f"; {len(delivered['duplicates'])} already delivered by this webhook, not queued again"
             if delivered["duplicates"] else ""))
    return 0


def _since(text: str | None) -> datetime | None:
    """`--since`: a duration back from now (`6h`, `7d`) or an ISO time (UTC unless it says)."""
    from investigations.sources.specs import parse_duration_s

    if text is None:
        return None
    try:
        return datetime.now(UTC) - timedelta(seconds=parse_duration_s(text))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--since {text!r} is neither a duration (30m, 6h, 7d) nor an ISO time") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _changes(args: argparse.Namespace) -> int:
    from investigations.evidence.records import RecordStore

    settings = Settings.from_env()
    try:
        since = _since(args.since)
    except ValueError as exc:
        print(f"investigations: {exc}", file=sys.stderr)
        return 2
    store = _store(settings)
    lead_ids = store.case_lead_ids(args.case)
    if lead_ids is None:
        print(f"investigations: no case {args.case!r}; `investigations cases list` lists the cases", file=sys.stderr)
        return 2
    rows = RecordStore(settings.records_dir).changes.read(lead_ids, since=since)
    values = {lead_id: lead for lead_id in lead_ids if (lead := store.get_lead(lead_id)) is not None}
    for row in rows:
        lead = values.get(row["lead_id"])
        row["lead"] = f"{lead.kind}:{lead.value}" if lead else row["lead_id"]
    if _printed_plainly(args, rows, none=f"no changes in case {args.case}" + (f" since {since:%Y-%m-%d %H:%M} UTC"
                                                                                 if since else "")):
        return 0
    table = _table("when", "source", "lead", "what", "records")
    for row in rows:
        if row["first"]:
            what, keys = f"first seen: {len(row['added'])}", row["added"]
        else:
            what = ", ".join(f"{sign}{len(row[name])} {name}" for sign, name in (("+", "added"), ("-", "removed"),
                                                                                  ("~", "modified")) if row[name])
            keys = [*(f"+{k}" for k in row["added"]), *(f"-{k}" for k in row["removed"]),
                    *(f"~{k}" for k in row["modified"])]
        shown = ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")
        table.add_row(f"{row['at']:%Y-%m-%d %H:%M}", row["source"], row["lead"], what, shown)
    _print_table(table, whole=("source",))
    return 0


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
    from investigations.scheduling.dispatch import lead_cadences
    from investigations.sources.catalog import load_catalog

    settings = Settings.from_env()
    store = _store(settings)
    rows = store.leads_overview()
    # How each source looks at each lead it monitors: its changes a day, when next, and why.
    catalog = load_catalog(settings.sources_path) if rows else None
    now = datetime.now(UTC)
    cadences = {spec.name: lead_cadences(store, spec, now=now) for spec in catalog.sources} if catalog else {}
    for row in rows:
        for source, coll in row["collections"].items():
            view = cadences.get(source, {}).get(row["lead_id"])
            coll["cadence"] = None if view is None else {
                "changes_per_day": round(view.changes_per_day, 4), "interval_s": view.interval_s,
                "next_due": view.next_due, "why": view.why}
    if _printed_plainly(args, rows, none="no leads"):
        return 0
    if args.cadence:
        table = _table("lead", "source", "changes/day", "next due (UTC)", "why")
        for row in rows:
            for source, coll in sorted(row["collections"].items()):
                if (cadence := coll["cadence"]) is not None:
                    due = f"{cadence['next_due']:%Y-%m-%d %H:%M}" if cadence["next_due"] else "never"
                    table.add_row(row["lead_id"], source, f"{cadence['changes_per_day']:.2g}", due, cadence["why"])
        _print_table(table, whole=("lead", "source"))
        return 0
    table = _table("lead", "kind", "value", "cases", "source", "last outcome", "records", "last with records")
    for row in rows:
        collections = sorted(row["collections"].items()) or [(None, None)]
        for n, (source, coll) in enumerate(collections):
            # A retired lead is no partition in Dagster's UI now; its history is all still here.
            cases = (", ".join(row["cases"]) or "-") + (" (retired)" if row["retired_at"] else "")
            head = [row["lead_id"], row["kind"], row["value"], cases] if n == 0 else [""] * 4
            if coll is None:
                table.add_row(*head, "-", "not collected", "", "")
                continue
            # An empty answer is an outcome, not a success: only a collection with records counts.
            found = coll["records"] and coll["outcome"] == "ok" and coll["last_success_at"]
            table.add_row(*head, source, coll["outcome"], str(coll["records"]),
                          coll["last_success_at"].isoformat(timespec="seconds") if found else "never")
    _print_table(table, whole=("lead", "kind", "source"))
    return 0


def runs_page_url(ui_url: str, run_ids: Sequence[str]) -> str:
    """The Dagster UI's Runs page filtered to these runs: one `id:` token each, as the UI itself links
    to the runs it just launched. Its tag filter matches whole values only, so a run of several leads
    cannot be found there by one of them; this link is how the Runs page shows a lead's runs."""
    from urllib.parse import urlencode

    return f"{ui_url.rstrip('/')}/runs?" + urlencode([("q[]", f"id:{run_id}") for run_id in dict.fromkeys(run_ids)])


def _leads_runs(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    lead_id = args.lead  # kind:value already made its id, and checked, by _check_filters
    rows = _store(settings).runs_of_lead(lead_id, source=args.source)
    url = runs_page_url(settings.ui_url, [row["run_id"] for row in rows]) if rows else None
    if args.json:
        print(json.dumps({"lead_id": lead_id, "runs": rows, "runs_page": url}, default=str, indent=2))
        return 0
    if not rows:
        print(f"no run has collected {lead_id}" + (f" for {args.source}" if args.source else ""))
        return 0
    table = _table("source", "run", "first request (UTC)", "last request (UTC)", "requests", right=("requests",))
    for row in rows:
        table.add_row(row["source"], row["run_id"], f"{row['first_at']:%Y-%m-%d %H:%M:%S}",
                      f"{row['last_at']:%Y-%m-%d %H:%M:%S}", str(row["requests"]))
    _print_table(table, whole=("run",))
    print(f"On the Runs page: {url}")
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
    _print_table(table, whole=("status",))
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
    _print_table(table, whole=("source", "lead", "reason"))
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
        table = _table("source", "record", "fetched", "capture", "warc file@offset", "payload sha256 (first 16)",
                       "identity", "parser")
        for row in rows:
            where = f"{row['warc_file']}@{row['warc_offset']}" if row["warc_file"] else "-"
            digest = f"sha256:{row['payload_sha256'][:16]}" if row["payload_sha256"] else "-"
            table.add_row(row["source"], row["record_key"], f"{row['fetched_at']:%Y-%m-%d %H:%M}",
                          row["capture_id"] or "-", where, digest, row["identity_id"] or "-",
                          row["parser_version"] or "-")
        # Copied whole to look a capture up: folded only when the console is too narrow for them.
        _print_table(table, whole=("source", "capture", "warc file@offset"))
        return 0
    table = _table("source", "lead", "record", "fetched", "fields")
    for row in rows:
        table.add_row(row["source"], row["lead_id"], row["record_key"], f"{row['fetched_at']:%Y-%m-%d %H:%M}",
                      row["fields"])
    _print_table(table, whole=("source", "lead"))
    return 0


def _export(args: argparse.Namespace) -> int:
    from investigations.evidence.casepackage import MANIFEST, export_case
    from investigations.evidence.signing import SigningError, load_signing_key

    settings = Settings.from_env()
    try:
        key = load_signing_key() if args.sign else None
        done = export_case(_store(settings), settings.data_dir, args.case, args.folder, signing_key=key)
    except (FileExistsError, FileNotFoundError, SigningError) as exc:
        print(f"investigations: {exc}", file=sys.stderr)
        return 2
    print(f"exported case {args.case}: {done.leads} lead(s), {done.records} record(s) in {done.record_files} "
          f"file(s), {done.warc_files} WARC file(s), {done.empty_answers} empty answer(s), {done.sources} source "
          f"spec(s), {done.bytes} bytes; manifest {done.folder / MANIFEST}, "
          + (f"signed by key {done.signed_by}" if done.signed_by else "not signed (export --sign signs it)"))
    return 0


def _signing_key(args: argparse.Namespace) -> int:
    from investigations.evidence.signing import fingerprint, new_signing_key, public_pem

    try:
        key = new_signing_key(args.path)
    except OSError as exc:
        print(f"investigations: {args.path}: {exc.strerror}; the key file must not exist yet", file=sys.stderr)
        return 2
    print(f"wrote a signing key to {args.path} (readable by you only); export --sign uses it with "
          f"INVESTIGATIONS_SIGNING_KEY={args.path}\nfingerprint {fingerprint(key.public_key())}\n"
          f"public key, for whoever checks your packages (`verify --key`):\n{public_pem(key)}", end="")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from investigations.evidence.casepackage import verify_package
    from investigations.evidence.signing import SigningError, load_public_key

    try:
        expected = load_public_key(args.key) if args.key else None
    except SigningError as exc:
        print(f"investigations: --key {exc}", file=sys.stderr)
        return 2
    result = verify_package(args.folder, expected_key=expected)
    for note in result.not_rechecked:
        print(f"NOT RE-CHECKED {note}", file=sys.stderr)
    if not result.ok:
        for problem in result.problems:
            print(f"MISMATCH {problem}", file=sys.stderr)
        print(f"investigations: {args.folder} FAILED verification: {len(result.problems)} problem(s) in "
              f"{result.files} file(s), {result.records} record(s), {result.empty_answers} empty answer(s)",
              file=sys.stderr)
        return 1
    told = (f"verified {result.files} file(s): {result.rechecked} of {result.records} record(s) read again from "
            f"their WARC captures and matching, {result.empty_answers} empty answer(s) empty in their captures")
    print(told + (": all match" if not result.not_rechecked
                  else f"; {len(result.not_rechecked)} not re-checked (listed above)"))
    print(f"signed by key {result.signed_by}: the signature over the manifest is valid"
          + ("" if args.key else " (compare the fingerprint with the one the exporter holds, or pass --key)")
          if result.signed_by else "not signed: nothing in the package says who exported it")
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
    the queue, the circuit and its pacing: the source lane's rates (in use, configured, the learned
    ceiling) and, as plain dicts, the source lane (`source_lane`, None before its first request) and
    its identities' lanes (`lanes`)."""
    from investigations.fleet.stats import fleet_figures, lane_standings
    from investigations.pacing import Circuits
    from investigations.sources.catalog import load_catalog
    from investigations.store import QUEUE_DEPTH_KEYS

    store = _store(settings)
    catalog = load_catalog(settings.sources_path)
    now = datetime.now(UTC)
    summary = {row["source"]: row for row in store.fleet_summary(since=now - timedelta(hours=hours))}
    depths = store.queue_depths(now=now)
    circuits = {source: state.state for source, state in Circuits(store).all_states().items()}
    lanes = [_lane_json(lane) for lane in lane_standings(store, catalog, now.timestamp())]
    figures = {f.source: f for f in fleet_figures(store, catalog, now=now, window_s=window_s, circuits=circuits,
                                                   data_dir=settings.data_dir)}
    rows = []
    for spec in catalog.sources:
        stats = summary.get(spec.name, {"requests": 0, "outcomes": {}, "latency_ms": 0.0, "last_at": None})
        shared = next((lane for lane in lanes if lane["source"] == spec.name and lane["identity_id"] is None), None)
        rows.append({
            **figures[spec.name].as_dict(),
            "requests": stats["requests"],
            "window_requests": figures[spec.name].requests,
            "outcomes": stats["outcomes"],
            "mean_latency_ms": round(stats["latency_ms"], 1),
            "last_request_at": stats["last_at"],
            "queue": depths.get(spec.name, dict.fromkeys(QUEUE_DEPTH_KEYS, 0)),
            "rate_per_s": shared["in_use_per_s"] if shared else spec.rate.source_per_s,
            "configured_rate_per_s": spec.rate.source_per_s,
            # The rate the source last throttled at, once it has: the lane settles just under it.
            "ceiling_rate_per_s": shared["ceiling_per_s"] if shared else None,
            "source_lane": shared,
            "lanes": [lane for lane in lanes if lane["source"] == spec.name and lane["identity_id"] is not None],
        })
    return rows


def _lane_json(lane: Any) -> dict[str, Any]:
    """A `LaneStanding` as the fleet's JSON gives it: rates to the thousandth, ages to the tenth of a second."""
    from dataclasses import asdict

    out = asdict(lane)
    for key, digits in (("in_use_per_s", 3), ("ceiling_per_s", 3), ("ceiling_age_s", 1)):
        if out[key] is not None:
            out[key] = round(out[key], digits)
    return out


# The fleet table's columns after `source`: what each source is doing, then what it holds and costs.
# A console too narrow for the whole table gets the two halves as two tables, each led by the source.
_FLEET_DOING = ("health", "backlog", "in flight", "req/min", "rec/min", "retry", "fail", "429/block", "empty",
                "p50/p95 ms")
_FLEET_HOLDING = ("cadence", "fresh", "stalest", "ids a/l/r/x", "dead", "spend/budget $", "rec/$", "circuit", "rate/s",
                  "requests")
# Words, kept whole while the figures give way; the other columns hold figures, right-justified.
_FLEET_LEFT = ("source", "health", "cadence", "circuit")


def _print_fleet(args: argparse.Namespace) -> None:
    from investigations.fleet.stats import every_text

    rows = _fleet_rows(Settings.from_env(), hours=args.hours, window_s=args.window_min * 60)
    if args.source is not None:
        rows = [row for row in rows if row["source"] == args.source]
    if args.json:
        print(json.dumps(rows, default=str, indent=None if args.watch else 2), flush=True)
        return
    console = _console()
    cells = [_fleet_cells(row) for row in rows]
    title = f"fleet: rates over {args.window_min:g} min, requests over {args.hours:g} h"
    table = _fleet_table(title, ("source", *_FLEET_DOING, *_FLEET_HOLDING), cells)
    if _fit_columns(table, console.width, whole=_FLEET_LEFT, squeeze=False):
        console.print(table, markup=False, highlight=False)
    else:
        _print_table(_fleet_table(title, ("source", *_FLEET_DOING), cells), whole=_FLEET_LEFT, console=console)
        _print_table(_fleet_table(None, ("source", *_FLEET_HOLDING), cells), whole=_FLEET_LEFT, console=console)
    for row in rows:
        if row["health_reason"] and row["health"] != "idle":
            console.print(f"  {row['source']}: {row['health']}: {row['health_reason']}", highlight=False,
                          markup=False)
    for row in rows:
        if row["cadence"] and row["cadence"]["budget_short"]:
            console.print(f"  {row['source']}: cadence: the budget is short: every lead at its max, "
                          f"{every_text(row['cadence']['max_s'])}", highlight=False, markup=False)
    for row in rows:
        for reason, count in sorted(row["parked"].items(), key=lambda item: -item[1]):
            console.print(f"  {row['source']}: {count} parked: {reason}", highlight=False, markup=False)
    _print_pacing(rows, console)


# The pacing table's columns: a lane (its source, and its identity or "-" for the source's own lane) and
# what its pacing has learned, in requests per second.
_PACING = ("source", "identity", "configured r/s", "in use r/s", "learned ceiling r/s", "ceiling age")


def _print_pacing(rows: Sequence[dict[str, Any]], console: Console) -> None:
    """Each lane that has sent (or been throttled), the source's own lane before its identities': the
    configured rate, the rate in use and the learned ceiling, with how long ago the source throttled
    at it ("-": never), and a line for each lane a Retry-After still holds."""
    lanes = [lane for row in rows for lane in ([row["source_lane"]] if row["source_lane"] else []) + row["lanes"]]
    if not lanes:
        return
    table = _table(*_PACING, title="pacing: each lane's rates now", right=_PACING[2:], rules=False)
    for lane in lanes:
        ceiling = lane["ceiling_per_s"]
        table.add_row(lane["source"], lane["identity_id"] or "-", _rate(lane["configured_per_s"]),
                      _rate(lane["in_use_per_s"]), "-" if ceiling is None else _rate(ceiling),
                      _age(lane["ceiling_age_s"]))
    _print_table(table, whole=("source", "identity"), console=console)
    now_s = time.time()
    for lane in lanes:
        if lane["floor_until_s"] is not None and lane["floor_until_s"] > now_s:
            name = lane["source"] + (f" ({lane['identity_id']})" if lane["identity_id"] else "")
            console.print(f"  {name}: held by a Retry-After for {_age(lane['floor_until_s'] - now_s)}",
                          highlight=False, markup=False)


def _rate(per_s: float) -> str:
    return f"{round(per_s, 3):g}"


def _fleet_cells(row: dict[str, Any]) -> dict[str, Any]:
    """One source's figures as the fleet table shows them, by column."""
    from rich.text import Text

    return {
        "source": row["source"], "health": Text(row["health"], style=_HEALTH_STYLE.get(row["health"], "red")),
        "backlog": str(row["backlog"]), "in flight": str(row["in_flight"]),
        "req/min": f"{row['requests_per_min']:.1f}", "rec/min": f"{row['records_per_min']:.1f}",
        "retry": _pct(row["retry_rate"]), "fail": _pct(row["failure_rate"]), "429/block": _pct(row["block_rate"]),
        "empty": _pct(row["empty_rate"]), "p50/p95 ms": f"{_num(row['latency_p50_ms'])}/{_num(row['latency_p95_ms'])}",
        "cadence": _cadence(row["cadence"]),
        "fresh": "-" if row["fresh_share"] is None else f"{row['fresh']}/{row['monitored']}",
        "stalest": _age(row["stalest_age_s"]), "ids a/l/r/x": _identity_counts(row), "dead": str(row["dead_letters"]),
        "spend/budget $": f"{row['spend_today_usd']:.2f}/"
                          + (f"{row['daily_budget_usd']:g}" if row["daily_budget_usd"] else "-"),
        "rec/$": _num(row["records_per_usd"]), "circuit": row["circuit"],
        "rate/s": f"{row['rate_per_s']:g}/{row['configured_rate_per_s']:g}"
                  + ("" if row["ceiling_rate_per_s"] is None else f" (ceiling {row['ceiling_rate_per_s']:g})"),
        "requests": str(row["requests"]),
    }


def _cadence(cadence: dict[str, Any] | None) -> str:
    """A source's cadence as the fleet table shows it (`stats.Cadence.text`)."""
    from investigations.fleet.stats import Cadence

    return "-" if cadence is None else Cadence(**cadence).text()


def _fleet_table(title: str | None, columns: Sequence[str], cells: Sequence[dict[str, Any]]) -> Table:
    table = _table(*columns, title=title, right=[name for name in columns if name not in _FLEET_LEFT], rules=False)
    for row in cells:
        table.add_row(*(row[name] for name in columns))
    return table


_HEALTH_STYLE = {"ok": "green", "idle": "dim", "stale": "yellow", "stalled": "yellow", "over_budget": "yellow"}


def _table(*columns: str, title: str | None = None, right: Collection[str] = (), rules: bool = True) -> Table:
    """A table whose long values fold within their column instead of being cut: every value is shown
    whole, over several lines when the console is narrow. Print it with `_print_table`. `right`: the
    columns justified right; without `rules`, columns are set apart by spaces alone (for tables of
    many short figures)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold", show_edge=False,
                  box=box.HEAVY_HEAD if rules else None)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", overflow="fold")
    return table


def _print_table(table: Table, *, whole: Collection[str] = (), console: Console | None = None) -> None:
    """Print `table` within the console's width (see `_fit_columns`), its values as they are: a `[`
    in a value is text, never a style."""
    console = console or _console()
    _fit_columns(table, console.width, whole=whole)
    console.print(table, markup=False, highlight=False)


def _fit_columns(table: Table, width: int, *, whole: Collection[str] = (), squeeze: bool = True) -> bool:
    """Give each column of `table` its width, so that the table is at most `width` characters wide.

    Each column starts as wide as its longest line. While the table is too wide, the widest column gives
    way, down to its header's longest word (a `whole` column, one of names or ids: down to its longest
    value), so the widest values fold first and short ones stay on one line. If that is not enough, the
    `whole` columns give way too, down to their header's longest word, and then every column, down to one
    character; without `squeeze` the table is left as it was and the answer is False.
    """
    columns = table.columns
    # A space on each side of every cell; with rules, one between cells (and one at each edge, if shown).
    room = width - 2 * len(columns) - (len(columns) - 1 + 2 * table.show_edge if table.box else 0)
    longest = [max(_text_width(cell) for cell in (column.header, *column.cells)) for column in columns]
    words = [min(length, _longest_word(column.header)) for length, column in zip(longest, columns, strict=True)]
    kept = [length if column.header in whole else word
            for length, word, column in zip(longest, words, columns, strict=True)]
    widths = _narrowed(longest, kept, room)
    if sum(widths) > room:
        if not squeeze:
            return False
        widths = _narrowed(_narrowed(widths, words, room), [1] * len(columns), room)
    for column, column_width in zip(columns, widths, strict=True):
        column.width = column_width
    return True


def _narrowed(widths: Sequence[int], floors: Sequence[int], room: int) -> list[int]:
    """`widths`, the widest above its floor narrowed one character at a time until they sum to `room`
    or every one is at its floor."""
    widths = list(widths)
    while sum(widths) > room:
        above = [n for n, (have, floor) in enumerate(zip(widths, floors, strict=True)) if have > floor]
        if not above:
            break
        widths[max(above, key=lambda n: widths[n])] -= 1
    return widths


def _text_width(cell: Any) -> int:
    from rich.cells import cell_len
    from rich.text import Text

    text = cell.plain if isinstance(cell, Text) else str(cell)
    return max([1, *(cell_len(line) for line in text.splitlines())])


def _longest_word(header: Any) -> int:
    from rich.cells import cell_len

    return max([1, *(cell_len(word) for word in str(header).split())])


def _console() -> Console:
    from rich.console import Console

    # Piped output is 240 columns wide, not 80, unless COLUMNS says otherwise: a script reading a
    # table gets whole rows.
    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    return Console(width=240 if piped else None)


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
    table = _table("identity", "tier", "range", "source", "state", "leased by", "rest until", "score", "rests",
                   "failures 24h", rules=False)
    for row in rows:
        rest = "-"
        if row.rest_until_s is not None:
            until = datetime.fromtimestamp(row.rest_until_s, UTC)
            rest = f"{until.isoformat(timespec='seconds')} (in {_age(row.rest_until_s - now.timestamp())})"
        table.add_row(row.identity_id, row.tier, row.range, row.source or "-", row.state, row.leased_by or "-", rest,
                      f"{row.score:g}", str(row.rests), str(row.failures))
    _print_table(table, whole=("identity", "source", "state"))
    return 0
