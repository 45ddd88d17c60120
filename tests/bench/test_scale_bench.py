"""The scale bench's pure parts: the sources file, the lead files, the history's spread, the UI's
GraphQL documents and the requests of a view, the percentile maths, the ticks' figures and the goal table.

Fast and process-free; the bench itself (a fleet with a webserver, thousands of leads) runs under `soak` only.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.scale import (
    ARCHIVE_CASE,
    DEFAULT_ACTIVE,
    DEFAULT_HISTORY,
    DEFAULT_LEADS,
    DEFAULT_SOURCES,
    DELIVERY_LEADS,
    FRAGMENTS,
    LIVE_QUERIES,
    OPERATIONS,
    PAGE_QUERIES,
    UI_BATCH,
    Tick,
    _post_data,
    catalog_cover,
    document,
    goal_rows,
    history_pairs,
    lead_files,
    lifecycle_of,
    nearest_rank,
    page_cover,
    parse_args,
    scale_sources_yaml,
    source_names,
    split_counts,
    summary,
    tick_figures,
    verdict,
    view_requests,
)
from investigations.cli import read_leads_file
from investigations.sources.specs import parse_sources

ROOT = Path(__file__).resolve().parents[2]


def test_the_sources_file_is_copies_of_the_sandbox_source_each_taking_domain_leads() -> None:
    text = scale_sources_yaml(10, (ROOT / "sources.yaml").read_text())
    catalog = parse_sources(text, env={"INVESTIGATIONS_SANDBOX_URL": "http://127.0.0.1:9"})
    names = [spec.name for spec in catalog.sources]
    assert names == source_names(10) == [f"src{n:02d}" for n in range(1, 11)]
    assert all("domain" in spec.lead_kinds for spec in catalog.sources)
    robust = parse_sources((ROOT / "sources.yaml").read_text(),
                           env={"INVESTIGATIONS_SANDBOX_URL": "http://127.0.0.1:9"}).get("robust")
    for spec in catalog.sources:  # the same route, rates and checks as the sandbox source they copy
        assert spec.request.url == robust.request.url
        assert spec.rate == robust.rate and spec.concurrency == robust.concurrency
    assert len(scale_sources_yaml(3, (ROOT / "sources.yaml").read_text()).split("- name: ")) == 4


def test_the_leads_are_the_closed_archive_then_ten_open_cases(tmp_path: Path) -> None:
    files = lead_files(DEFAULT_LEADS, DEFAULT_ACTIVE)
    assert files[0].case_id == ARCHIVE_CASE and files[0].count == 900_000
    assert [f.case_id for f in files[1:]] == [f"open-{n:02d}" for n in range(1, 11)]
    assert [f.count for f in files[1:]] == [10_000] * 10
    small = lead_files(20_000, 2_005)
    assert sum(f.count for f in small) == 20_000 and [f.count for f in small[1:]] == [201] * 5 + [200] * 5
    assert [f.case_id for f in lead_files(5, 5)] == [f"open-{n:02d}" for n in range(1, 6)]  # no archive
    with pytest.raises(ValueError):
        lead_files(10, 11)
    # Every line is one `investigations leads add --file` reads, every lead distinct across the files.
    ids: list[str] = []
    for entry in lead_files(300, 40):
        path = tmp_path / f"{entry.case_id}.txt"
        path.write_text("\n".join(entry.lines()) + "\n")
        ids += [lead.id for lead in read_leads_file(path)]
    assert len(ids) == len(set(ids)) == 300


def test_split_counts_is_as_even_as_whole_numbers_go() -> None:
    assert split_counts(10, 3) == [4, 3, 3]
    assert split_counts(9, 3) == [3, 3, 3]
    assert split_counts(2, 4) == [1, 1, 0, 0]


def test_the_history_is_distinct_pairs_spread_over_every_lead_and_source() -> None:
    leads = [f"l{n}" for n in range(7)]
    sources = source_names(3)
    pairs = list(history_pairs(14, leads, sources))
    assert len(pairs) == len(set(pairs)) == 14
    assert {lead for _, lead in pairs[:7]} == set(leads)  # every lead once before any twice
    assert sorted(Counter(lead for _, lead in pairs).values()) == [2] * 7
    assert max(Counter(s for s, _ in pairs).values()) - min(Counter(s for s, _ in pairs).values()) <= 1
    # Never more than leads x sources: each pair once.
    every = list(history_pairs(100, leads, sources))
    assert len(every) == len(set(every)) == 21
    # The issue's sizes: 200,000 over 100,000 leads x 10 sources, 20,000 per source.
    full = Counter(s for s, _ in history_pairs(DEFAULT_HISTORY, [str(n) for n in range(DEFAULT_ACTIVE)],
                                               source_names(DEFAULT_SOURCES)))
    assert set(full.values()) == {DEFAULT_HISTORY // DEFAULT_SOURCES}


def test_nearest_rank_percentiles() -> None:
    ten = [float(n) for n in range(10, 0, -1)]
    assert nearest_rank(ten, 0.95) == 10.0  # p95 of 10 values is the 10th: the largest
    assert nearest_rank(ten, 0.50) == 5.0
    assert nearest_rank([float(n) for n in range(1, 21)], 0.95) == 19.0
    assert nearest_rank([3.0], 0.5) == 3.0
    assert nearest_rank([], 0.5) is None
    assert summary([2.0, 1.0, 3.0]) == {"n": 3, "p50": 2.0, "p95": 3.0, "max": 3.0}
    assert summary([]) == {"n": 0, "p50": None, "p95": None, "max": None}


def test_a_goal_is_met_only_when_known_and_within() -> None:
    assert verdict(1.9, 2.0) == "met"
    assert verdict(2.0, 2.0) == "met"
    assert verdict(2.1, 2.0) == "NOT met"
    assert verdict(2.1, 2.0, lower_bound=True) == "NOT met"  # already above, whatever it truly was
    assert verdict(1.0, 2.0, lower_bound=True) == "-"  # may truly lie above
    assert verdict(None, 2.0) == "-"


def test_every_document_spreads_only_its_own_fragments_each_once() -> None:
    for operation in OPERATIONS:
        text = document(operation)
        assert text.startswith(f"query {operation}")
        defined = [line.split()[1] for line in text.splitlines() if line.startswith("fragment ")]
        assert len(defined) == len(set(defined))
        spread = set(__import__("re").findall(r"\.\.\.([A-Za-z_]\w*)", text))
        assert spread == set(defined)
    assert "partitionStats" in document("AssetGraphLiveQuery")
    assert "assetPartitionStatuses" in document("PartitionHealthQuery")
    assert "partitionKeys" in document("PartitionHealthQuery")
    assert set(FRAGMENTS) == {n for op in OPERATIONS for n in FRAGMENTS if f"fragment {n} " in document(op)}


def test_every_document_is_valid_against_the_installed_dagster_schema() -> None:
    from dagster_graphql.schema import create_schema
    from graphql import parse, validate

    schema = create_schema().graphql_schema
    for operation in OPERATIONS:
        assert validate(schema, parse(document(operation))) == [], operation


def test_the_catalog_asks_live_data_ten_assets_a_request_and_the_page_for_its_own() -> None:
    keys = [["sources", name] for name in source_names(10)] + [["fleet", "sources", n] for n in source_names(10)]
    keys += [["fleet", "health"], ["fleet", "dead_letters"]]
    catalog = view_requests("catalog", keys, ["sources", "src01"])
    assert catalog[0] == ("AssetRecordsQuery", {"limit": 1000})
    live = catalog[1:]
    assert [op for op, _ in live] == list(LIVE_QUERIES) * 3  # 22 assets: 10, 10 and 2
    sizes = [len(v["assetKeys"]) for op, v in live if op == "AssetGraphLiveQuery"]
    assert sizes == [UI_BATCH, UI_BATCH, 2]
    asked = [k["path"] for op, v in live if op == "AssetGraphLiveQuery" for k in v["assetKeys"]]
    assert asked == sorted(keys, key="/".join)  # in the order the catalog lists them
    page = view_requests("asset_page", keys, ["sources", "src01"])
    assert [op for op, _ in page] == [*PAGE_QUERIES, *LIVE_QUERIES]
    assert page[2][1] == {"assetKey": {"path": ["sources", "src01"]}}
    assert page[3][1] == {"assetKeys": [{"path": ["sources", "src01"]}]}


def test_a_page_is_loaded_when_its_data_answered() -> None:
    key = ["sources", "src01"]
    live = ("AssetGraphLiveQuery", {"assetKeys": [{"path": key}]})
    cover = page_cover(key)
    assert cover([]) == 0
    assert cover([live, ("AssetViewDefinitionQuery", {})]) == 2
    assert cover([live, ("AssetViewDefinitionQuery", {}), ("PartitionHealthQuery", {})]) == 3
    assert cover([("AssetGraphLiveQuery", {"assetKeys": [{"path": ["sources", "src02"]}]})]) == 0
    assert catalog_cover([live, live, ("AssetGraphLiveQuery", {"assetKeys": [{"path": ["a"]}, {"path": ["b"]}]}),
                          ("AssetsFreshnessInfoQuery", {"assetKeys": [{"path": ["c"]}]})]) == 3


def test_a_requests_body_is_read_from_post_data_or_its_entries() -> None:
    body = {"operationName": "PartitionHealthQuery", "variables": {}}
    raw = json.dumps(body)
    assert _post_data({"postData": raw}) == body
    assert _post_data({"postDataEntries": [{"bytes": base64.b64encode(raw.encode()).decode()}]}) == body
    assert _post_data({}) is None
    assert _post_data({"postData": "not json"}) is None


def test_the_lifecycle_line_is_read_from_the_sensors_log() -> None:
    assert lifecycle_of("lead partitions: 20000 retired, 0 brought back (more next tick)") == (20000, 0)
    assert lifecycle_of("lead partitions: 3 retired, 12 brought back") == (3, 12)
    assert lifecycle_of("1000 inbox row(s), 10000 queued, 4 run(s) requested") is None


def test_ticks_are_told_apart_by_phase_runs_and_the_wait() -> None:
    wait = 28.5
    ticks = [
        Tick(start_s=10, end_s=40.0, status="skipped", runs=0, lifecycle_s=0.9, retired=20000),
        Tick(start_s=45, end_s=73.6, status="skipped", runs=0),
        Tick(start_s=80, end_s=82.0, status="success", runs=3),
        Tick(start_s=90, end_s=None, status="started", runs=0),  # still going: left out
        Tick(start_s=200, end_s=229.0, status="skipped", runs=0),
    ]
    figures = tick_figures(ticks, [("first", 0, 100), ("second", 100, 300)], wait)
    first = figures["first"]
    assert first["ticks"] == 3 and first["by_status"] == {"skipped": 2, "success": 1}
    assert first["with_runs_wall_s"]["max"] == pytest.approx(2.0)
    assert first["past_the_wait_s"]["max"] == pytest.approx(1.5)  # 30 s - 28.5 s
    assert first["past_the_wait_s"]["p50"] == pytest.approx(0.1)
    assert first["lifecycle_s"] == {"n": 1, "p50": 0.9, "p95": 0.9, "max": 0.9}
    assert first["lifecycle_retired"] == 20000
    assert figures["second"]["ticks"] == 1 and figures["second"]["past_the_wait_s"]["max"] == pytest.approx(0.5)


def _figures(**changes: object) -> dict[str, object]:
    cell = {"n": 10, "p50": 0.4, "p95": 1.2, "max": 1.2}
    figures: dict[str, object] = {
        "setup": {"files": [{"case_id": ARCHIVE_CASE, "leads": 900_000, "wall_s": 61.0}],
                  "close": {"wall_s": 0.8}},
        "history": {"written": 200_000, "wall_s": 230.0},
        "partitions": {"exact": True, "exact_after_daemon_s": 21.0},
        "retire": {"archive": 900_000, "done": True, "after_close_s": 700.0},
        "queries": {"catalog": {"total_s": cell}, "asset_page": {"total_s": {**cell, "p95": 2.5}}},
        "idle": {"fleet_cores": 0.12},
        "ticks": {"all": {"past_the_wait_s": {"p95": 0.3}, "lifecycle_s": {"max": 2.9}}},
        "fresh": {"first_request_s": {"p95": {"s": 3.1, "lower_bound": False}}},
        "case": {"leads": 10_000, "queued_after_first_send_s": 45.0, "all_queued": False},
    }
    figures.update(changes)
    return figures


def test_the_goal_table_has_every_goal_with_its_verdict() -> None:
    rows = {row[0]: row[1:] for row in goal_rows(_figures())}
    assert rows["Asset Catalog GraphQL p95"] == ["1.20 s", "<= 2 s", "met"]
    assert rows["source page GraphQL p95"] == ["2.50 s", "<= 2 s", "NOT met"]
    assert rows["idle CPU, daemon + code server (cores)"] == ["0.120", "<= 0.2", "met"]
    assert rows["fresh lead: 202 -> first request p95"] == ["3.10 s", "<= 4 s", "met"]
    assert rows["10,000-lead case: first send -> all collections queued"] == [">45.0 s", "<= 30 s", "NOT met"]
    assert rows["partitions hold exactly the active leads, after the daemon started"] == ["21.0 s", "-", "report"]
    assert rows["the closed case's 900,000 leads retired, after its close"] == ["700 s", "-", "report"]
    assert rows["`leads add --file` 900,000 leads, case archive"] == ["61.0 s", "-", "report"]
    assert rows["new_leads ticks with nothing to do: past their inbox wait, p95"] == ["0.30 s", "-", "report"]
    assert rows["new_leads lifecycle passes, longest (from the tick's start)"] == ["2.90 s", "-", "report"]
    # Parts that did not run read as unknown, not as met.
    empty = {row[0]: row[1:] for row in goal_rows({})}
    assert empty["Asset Catalog GraphQL p95"] == ["-", "<= 2 s", "-"]
    assert empty["idle CPU, daemon + code server (cores)"][2] == "-"
    still = {row[0]: row[3] for row in goal_rows(_figures(fresh={"first_request_s": {"p95": {"s": 2.0, "lower_bound": True}}}))}
    assert still["fresh lead: 202 -> first request p95"] == "-"


def test_the_options_default_to_the_issues_sizes() -> None:
    args = parse_args([])
    assert (args.leads, args.active, args.history, args.sources, args.queries) == (1_000_000, 100_000, 200_000, 10, 10)
    assert (args.fresh, args.case_leads, args.quiet_s, args.postgres) == (20, 10_000, 120.0, False)
    smoke = parse_args(["--leads", "20000", "--active", "2000", "--history", "4000", "--queries", "3", "--quiet-s", "30"])
    assert (smoke.leads, smoke.active, smoke.history, smoke.queries, smoke.quiet_s) == (20000, 2000, 4000, 3, 30.0)
    with pytest.raises(SystemExit):
        parse_args(["--leads", "10", "--active", "11"])


def test_a_delivery_is_the_intakes_largest() -> None:
    from investigations.intake.app import DEFAULT_MAX_LEADS

    assert DELIVERY_LEADS == DEFAULT_MAX_LEADS


@pytest.mark.soak
def test_scale_bench_runs_end_to_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--leads", "3000", "--active", "300", "--history", "600",
         "--queries", "2", "--browser-loads", "1", "--quiet-s", "10", "--fresh", "3", "--fresh-gap-s", "1",
         "--case-leads", "1500", "--retire-timeout-s", "0", "--results-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    figures = json.loads((tmp_path / "scale.json").read_text())
    assert {"config", "setup", "history", "partitions", "idle", "queries", "fresh", "case", "ticks", "goals"} <= set(figures)
    assert figures["partitions"]["exact"], figures["partitions"]
    assert figures["history"]["written"] == 600
    assert set(figures["queries"]) >= {"catalog", "asset_page"}
    assert figures["case"]["wanted"] == 1500 * 10
