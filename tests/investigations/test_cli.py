"""The `investigations` command reads the state store an operator points it at."""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from investigations.cli import main
from investigations.collection.events import FetchEvent, Outcome
from investigations.config import Settings
from investigations.intake.leads import normalize_lead
from investigations.pacing import Circuits, GapSampler, RateLanes
from investigations.pacing.lanes import identity_lane, source_lane
from investigations.sources.specs import load_sources
from investigations.store import StateStore


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(tmp_path))
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    store.put_dead_letter(source="flaky", lead_id="domain-1", reason_group="transient", last_status=503,
                          attempts=4, last_error="HTTP 503 (exhausted 4 attempts)")
    return store


def test_dlq_list_shows_reason_status_and_attempts(state, capsys) -> None:
    assert main(["dlq", "list"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if "domain-1" in line]
    assert [cell.strip() for cell in row.split("│")][:5] == ["flaky", "domain-1", "transient", "503", "4"]
    assert "HTTP 503 (exhausted 4 attempts)" in out  # whole, not cut


def test_dlq_requeue_twice_queues_once_and_says_so(state, capsys) -> None:
    assert main(["dlq", "requeue", "--source", "flaky"]) == 0
    assert "requeued 1 of 1" in capsys.readouterr().out
    assert main(["dlq", "requeue", "--source", "flaky"]) == 0
    assert "requeued 0 of 1 matching dead letter(s); 1 already queued" in capsys.readouterr().out
    assert state.queue_depths()["flaky"]["ready"] == 1
    main(["dlq", "list"])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "domain-1" in line]
    assert [cell.strip() for cell in row.split("│")][6] == "yes"


def test_dlq_requeue_without_a_filter_refuses(state, capsys) -> None:
    assert main(["dlq", "requeue"]) == 2
    assert "--all" in capsys.readouterr().err


def test_leads_add_rejects_a_private_address_with_a_clear_error(state, capsys) -> None:
    assert main(["leads", "add", "ip", "10.0.0.1", "--case", "c1"]) == 2
    assert "private address" in capsys.readouterr().err


def test_fleet_shows_backlog_circuit_and_the_current_rate_per_source(state, monkeypatch, capsys) -> None:
    sources = Path(__file__).resolve().parents[2] / "sources.yaml"
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(sources))
    fragile = load_sources(sources).get("fragile")
    state.enqueue([("fragile", "l1"), ("fragile", "l2")], origin="t", priority_class="interactive")
    for _ in range(fragile.circuit.failure_threshold):
        Circuits(state).record("fragile", fragile.circuit, success=False)
    RateLanes(state, sampler=GapSampler(random.Random(1))).feedback(
        [source_lane(fragile)], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=fragile.throttle)
    assert main(["fleet", "--json"]) == 0
    rows = {row["source"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["fragile"]["queue"] == {"ready": 2, "waiting": 0, "dispatched": 0,
                                      "ready_interactive": 2, "dispatched_interactive": 0}
    assert rows["fragile"]["circuit"] == "open"
    assert rows["fragile"]["rate_per_s"] == fragile.rate.source_per_s * fragile.throttle.decrease_factor
    assert rows["fragile"]["ceiling_rate_per_s"] == fragile.rate.source_per_s  # throttled at the configured rate
    assert rows["robust"]["circuit"] == "closed"
    assert rows["robust"]["ceiling_rate_per_s"] is None  # never throttled: no ceiling known


def test_closing_and_reopening_a_case(state, capsys) -> None:
    from investigations.intake.leads import normalize_lead

    state.add_lead(normalize_lead("domain", "example.com"), case_id="case-7")
    assert main(["cases", "close", "case-7"]) == 0
    assert "case case-7 is closed" in capsys.readouterr().out
    main(["cases", "list"])
    assert "closed" in capsys.readouterr().out
    assert main(["cases", "reopen", "case-7"]) == 0
    assert state.cases_overview()[0]["status"] == "active"
    assert main(["cases", "close", "nope"]) == 2


def test_backfill_queues_every_lead_the_source_takes_once_a_day(state, monkeypatch, capsys) -> None:
    from investigations.intake.leads import normalize_lead

    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(Path(__file__).resolve().parents[2] / "sources.yaml"))
    for value in ("a.example", "b.example"):
        state.add_lead(normalize_lead("domain", value), case_id="c")
    state.add_lead(normalize_lead("ip", "8.8.8.8"), case_id="c")  # fragile does not take ip leads
    assert main(["backfill", "--source", "fragile"]) == 0
    assert "queued 2 of 2" in capsys.readouterr().out
    main(["backfill", "--source", "fragile"])
    assert "queued 0 of 2" in capsys.readouterr().out
    assert main(["backfill", "--source", "nope"]) == 2


def test_fleet_says_why_parked_collections_wait(state, monkeypatch, capsys) -> None:
    from datetime import UTC, datetime

    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(Path(__file__).resolve().parents[2] / "sources.yaml"))
    state.enqueue([("robust", "l1"), ("robust", "l2")], origin="t", priority_class="backfill")
    state.dispatch("robust", limit=2)
    state.park_dispatched("robust", "l1", until=datetime.now(UTC), reason="rate lane full for 130 s")
    assert main(["fleet", "--json"]) == 0
    rows = {row["source"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["robust"]["parked"] == {"rate lane full for 130 s": 1} and rows["quiet"]["parked"] == {}
    assert main(["fleet"]) == 0
    assert "robust: 1 parked: rate lane full for 130 s" in capsys.readouterr().out


SOURCES = Path(__file__).resolve().parents[2] / "sources.yaml"


def _fetched(store, source, outcome, *, requests=1, status=200, identity_id="direct"):
    from datetime import UTC, datetime

    from investigations.collection.events import FetchEvent

    store.record_fetches(
        FetchEvent(source=source, lead_id="l", identity_id=identity_id, url="https://x.example/", method="GET",
                   status=status, outcome=outcome, latency_ms=12.0, bytes=100, attempt=1, at=datetime.now(UTC))
        for _ in range(requests))


def test_fleet_figures_and_health_per_source_as_json(state, monkeypatch, capsys) -> None:
    from investigations.intake.leads import normalize_lead

    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    lead = normalize_lead("domain", "example.com")
    state.add_lead(lead, case_id="case-1")
    _fetched(state, "robust", Outcome.OK, requests=6)
    state.complete_collection(source="robust", lead_id=lead.id, outcome="ok", records=4, content_hash="h", path="/p",
                              run_id="r")
    _fetched(state, "quiet", Outcome.OK, requests=6)
    state.complete_collection(source="quiet", lead_id=lead.id, outcome="empty", records=0, content_hash="h", path="/p",
                              run_id="r")
    _fetched(state, "fragile", Outcome.THROTTLED, requests=3, status=429)
    assert main(["fleet", "--json", "--window-min", "5"]) == 0
    rows = {row["source"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"robust", "fragile", "flaky", "quiet", "slow", "changing"}
    assert {source: row["health"] for source, row in rows.items()} == {
        "robust": "ok", "quiet": "empty", "fragile": "blocked", "flaky": "idle", "slow": "idle", "changing": "idle"}
    robust = rows["robust"]
    assert robust["requests_per_min"] == 6 / 5 and robust["records_per_min"] == 4 / 5
    assert (robust["fresh"], robust["monitored"], robust["latency_p95_ms"]) == (1, 1, 12.0)
    assert rows["quiet"]["fresh"] == 0  # an empty answer is not fresh
    assert rows["flaky"]["dead_letters"] == 1 and rows["fragile"]["block_rate"] == 1.0


def test_fleet_table_has_a_health_column_and_says_why_a_source_is_unhealthy(state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    _fetched(state, "fragile", Outcome.THROTTLED, requests=3, status=429)
    assert main(["fleet"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "source" in line and "health" in line)
    assert header.split()[:3] == ["source", "health", "backlog"]
    assert "fragile: blocked: 3 of 3 requests throttled or blocked" in out
    assert "slow: idle" not in out  # idle needs no explanation


def test_fleet_watch_refreshes_until_interrupted(state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("investigations.cli.time.sleep", sleep)
    assert main(["fleet", "--json", "--watch", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert naps == [0.5, 0.5] and len(lines) == 2  # one JSON document per refresh, one per line
    assert {row["source"] for row in json.loads(lines[1])} >= {"robust", "quiet"}
    assert main(["fleet", "--watch", "0"]) == 2



def _paced(store: StateStore) -> float:
    """Lanes as the fetcher's feedback leaves them, five minutes ago: fragile throttled on its own
    lane (sent directly) and on its identity dc1_a's, robust and its identity dc1_b never throttled.
    Returns when."""
    catalog = load_sources(SOURCES)
    fragile, robust = catalog.get("fragile"), catalog.get("robust")
    at_s = time.time() - 300
    lanes = RateLanes(store, sampler=GapSampler(random.Random(1)), clock=lambda: at_s)
    lanes.feedback([identity_lane(fragile, "dc1_a")], outcome=Outcome.THROTTLED, retry_after_s=None,
                   throttle=fragile.throttle, pooled_identity=True)
    lanes.feedback([source_lane(fragile)], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=fragile.throttle)
    lanes.feedback([source_lane(robust), identity_lane(robust, "dc1_b")], outcome=Outcome.OK, retry_after_s=None,
                   throttle=robust.throttle)
    return at_s


def _pacing_rows(out: str) -> list[list[str]]:
    """The pacing table's rows, cell by cell (no value there holds a space)."""
    lines = out.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("pacing:"))
    assert lines[start + 1].split() == ["source", "identity", "configured", "r/s", "in", "use", "r/s", "learned",
                                        "ceiling", "r/s", "ceiling", "age"]
    return [line.split() for line in lines[start + 2:] if line.strip() and not line.startswith("  ")]


def test_fleet_prints_each_lane_s_configured_rate_rate_in_use_and_learned_ceiling(state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    _paced(state)
    assert main(["fleet"]) == 0
    assert _pacing_rows(capsys.readouterr().out) == [
        ["robust", "-", "10", "10", "-", "-"],  # sent, never throttled: no ceiling known
        ["robust", "dc1_b", "5", "5", "-", "-"],
        ["fragile", "-", "1.5", "0.75", "1.5", "5.0m"],  # throttled at 1.5 r/s five minutes ago, halved
        ["fragile", "dc1_a", "1.5", "0.75", "1.5", "5.0m"],
    ]  # flaky, quiet and slow never sent: they have no lane
    assert main(["fleet", "--source", "fragile"]) == 0
    assert [row[:2] for row in _pacing_rows(capsys.readouterr().out)] == [["fragile", "-"], ["fragile", "dc1_a"]]


def test_fleet_without_a_lane_prints_no_pacing_table(state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    _paced(state)
    assert main(["fleet", "--source", "quiet"]) == 0
    assert "pacing:" not in capsys.readouterr().out


def test_fleet_says_how_long_a_retry_after_still_holds_a_lane(state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    quiet = load_sources(SOURCES).get("quiet")
    RateLanes(state, sampler=GapSampler(random.Random(1))).feedback(
        [source_lane(quiet)], outcome=Outcome.THROTTLED, retry_after_s=600, throttle=quiet.throttle)
    assert main(["fleet"]) == 0
    out = capsys.readouterr().out
    assert _pacing_rows(out) == [["quiet", "-", "5", "2.5", "5", "0s"]]
    assert "  quiet: held by a Retry-After for 10.0m" in out or "  quiet: held by a Retry-After for 9.9m" in out


def test_fleet_json_gives_each_source_its_lanes_and_keeps_the_source_lane_s_rates(state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    cut_s = _paced(state)
    assert main(["fleet", "--json"]) == 0
    rows = {row["source"]: row for row in json.loads(capsys.readouterr().out)}
    fragile, robust, quiet = rows["fragile"], rows["robust"], rows["quiet"]
    (identity,) = fragile["lanes"]
    age = identity.pop("ceiling_age_s")
    assert identity == {"source": "fragile", "identity_id": "dc1_a", "configured_per_s": 1.5, "in_use_per_s": 0.75,
                        "ceiling_per_s": 1.5, "floor_until_s": None}
    assert age == pytest.approx(time.time() - cut_s, abs=5)
    assert (fragile["rate_per_s"], fragile["configured_rate_per_s"], fragile["ceiling_rate_per_s"]) == (0.75, 1.5, 1.5)
    assert fragile["source_lane"]["identity_id"] is None and fragile["source_lane"]["ceiling_per_s"] == 1.5
    assert [(lane["identity_id"], lane["in_use_per_s"], lane["ceiling_per_s"]) for lane in robust["lanes"]] == [
        ("dc1_b", 5, None)]
    assert (quiet["source_lane"], quiet["lanes"], quiet["rate_per_s"], quiet["ceiling_rate_per_s"]) == (None, [], 5, None)


def test_identities_lists_the_pool_without_credentials(state, monkeypatch, capsys) -> None:
    from investigations.identities import IdentityPool, parse_identities

    password = "s3cret-proxy-pass-77"
    catalog = parse_identities("""
tiers: [datacenter]
identities:
  - {id: dc1_a, range: dc1, tier: datacenter, proxy_url: "http://fleet:${PROXY_PASS}@127.0.0.9:8080"}
  - {id: dc1_b, range: dc1, tier: datacenter}
""", env={"PROXY_PASS": password})
    pool = IdentityPool(state, catalog, rng=random.Random(1))
    lease = pool.acquire("robust", holder="run-abc", ttl_s=60)
    assert lease is not None
    pool.report(lease, "identity_fault", status=403)  # a hard block: rests at robust
    other = pool.acquire("robust", holder="run-def", ttl_s=60)
    assert other is not None and other.identity_id != lease.identity_id
    _fetched(state, "robust", Outcome.BLOCKED, status=403, identity_id=lease.identity_id)
    assert main(["identities", "--json"]) == 0
    rows = {(row["identity_id"], row["source"]): row for row in json.loads(capsys.readouterr().out)}
    assert rows[(lease.identity_id, "robust")]["state"] == "resting"
    assert rows[(lease.identity_id, "robust")]["failures"] == 1
    assert (rows[(other.identity_id, "robust")]["state"], rows[(other.identity_id, "robust")]["leased_by"]) == (
        "leased", "run-def")
    assert main(["identities"]) == 0
    out = capsys.readouterr().out
    assert "resting" in out and "run-def" in out and lease.identity_id in out
    for listing in (out, json.dumps(list(rows.values()))):
        assert password not in listing and "127.0.0.9" not in listing and "fleet:" not in listing
    pool.close()


def test_identities_without_a_pool_says_requests_go_out_directly(state, capsys) -> None:
    assert main(["identities"]) == 0
    assert "`direct`" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["dlq", "list", "--source", "nosuch"], "unknown source 'nosuch' (known: robust, fragile, flaky, quiet, slow, changing)"),
        (["dlq", "requeue", "--reason", "bogus"], "unknown reason 'bogus' (known: throttled, transient,"),
        (["identities", "--source", "nosuch"], "unknown source 'nosuch'"),
        (["backfill", "--source", "nosuch"], "unknown source 'nosuch'"),
        (["records", "--lead", "domain:not a domain"], "not a domain"),
        (["fleet", "--source", "nosuch"], "unknown source 'nosuch' (known: robust, fragile, flaky, quiet, slow, changing)"),
    ],
)
def test_a_filter_naming_nothing_is_an_error_with_the_valid_choices(state, capsys, argv, says) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"investigations: {says}") or says in err
    assert not err.startswith('investigations: "') and "Traceback" not in err  # no Python repr
    assert state.queue_depths() == {}  # nothing was requeued or queued


@pytest.mark.parametrize("argv", [["fleet", "--hours", "-1"], ["records", "--limit", "0"]])
def test_a_number_that_must_be_positive_is_refused_by_the_parser(state, capsys, argv) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and "must be above 0" in capsys.readouterr().err


def test_a_dead_letter_is_requeued_by_its_lead_given_as_kind_and_value(state, capsys, tmp_path) -> None:
    lead = normalize_lead("domain", "example.com")
    state.add_lead(lead, case_id="case-1")
    state.put_dead_letter(source="robust", lead_id=lead.id, reason_group="blocked", last_status=403, attempts=2,
                          last_error="HTTP 403")
    assert main(["dlq", "requeue", "--lead", "domain:Example.COM"]) == 0
    assert "requeued 1 of 1" in capsys.readouterr().out


def test_the_cli_finds_the_project_s_state_from_any_folder(monkeypatch, tmp_path) -> None:
    from investigations.config import project_root

    project = tmp_path / "project"
    (project / "deep" / "down").mkdir(parents=True)
    for marker in ("workspace.yaml", "sources.yaml"):
        (project / marker).write_text("")
    monkeypatch.delenv("INVESTIGATIONS_HOME", raising=False)
    assert project_root({}, cwd=project / "deep" / "down") == project
    assert project_root({"INVESTIGATIONS_HOME": str(tmp_path)}, cwd=project) == tmp_path
    # Outside any project folder: the project this package was installed from.
    assert project_root({}, cwd=tmp_path) == Path(__file__).resolve().parents[2]
    monkeypatch.chdir(project / "deep")
    settings = Settings.from_env({})
    assert settings.data_dir == project / ".investigations" and settings.sources_path == project / "sources.yaml"


def test_leads_add_from_a_file_registers_every_lead_in_the_case(state, tmp_path, capsys) -> None:
    leads_file = tmp_path / "leads.txt"
    leads_file.write_text("# a case's leads\ndomain a.example\n\nusername alice\ndomain a.example\n")
    assert main(["leads", "add", "--file", str(leads_file), "--case", "c-bulk"]) == 0
    assert "registered 2 lead(s) in case c-bulk" in capsys.readouterr().out
    assert {row["value"] for row in state.leads_overview() if "c-bulk" in row["cases"]} == {"a.example", "alice"}


def test_leads_add_from_a_file_names_bad_lines_and_registers_nothing(state, tmp_path, capsys) -> None:
    leads_file = tmp_path / "leads.txt"
    leads_file.write_text("domain b.example\nplanet mars\n")
    assert main(["leads", "add", "--file", str(leads_file), "--case", "c-bad"]) == 2
    assert f"{leads_file}:2" in capsys.readouterr().err
    assert not [row for row in state.leads_overview() if "c-bad" in row["cases"]]


def test_leads_add_takes_a_lead_or_a_file_not_both(state, tmp_path, capsys) -> None:
    assert main(["leads", "add", "domain", "c.example", "--file", str(tmp_path / "x"), "--case", "c"]) == 2
    assert main(["leads", "add", "--case", "c"]) == 2


def test_fleet_with_a_source_shows_that_source_alone(state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    assert main(["fleet", "--source", "fragile", "--json"]) == 0
    assert [row["source"] for row in json.loads(capsys.readouterr().out)] == ["fragile"]
    assert main(["fleet", "--source", "fragile"]) == 0
    out = capsys.readouterr().out
    assert "fragile" in out and not {"robust", "flaky", "quiet", "slow"} & set(out.split())


LEAD_COMMANDS = [["records"], ["dlq", "requeue"]]


@pytest.mark.parametrize("command", LEAD_COMMANDS)
@pytest.mark.parametrize(("lead", "says"), [
    ("garbage", "--lead 'garbage' is not a lead"),
    ("foo:bar", "unknown lead kind 'foo'"),
    ("domain:not a domain", "'not a domain' is not a valid domain name"),
    ("domain:", "domain lead is empty"),
])
def test_a_malformed_lead_is_an_error_that_shows_the_expected_form(state, capsys, command, lead, says) -> None:
    assert main([*command, "--lead", lead]) == 2
    err = capsys.readouterr().err
    assert err.startswith("investigations: ") and says in err
    assert "kind:value (e.g. domain:example.com;" in err and "investigations leads list" in err
    assert state.queue_depths() == {}


@pytest.mark.parametrize("command", LEAD_COMMANDS)
@pytest.mark.parametrize("lead", ["domain:nosuch.example", normalize_lead("domain", "nosuch.example").id])
def test_a_lead_the_state_store_does_not_have_is_an_error_that_says_how_to_list_leads(
        state, capsys, command, lead) -> None:
    state.add_lead(normalize_lead("domain", "example.com"), case_id="case-1")
    assert main([*command, "--lead", lead]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"investigations: no lead {lead}") and "`investigations leads list` lists the leads" in err
    assert state.queue_depths() == {}


@pytest.mark.parametrize("lead", ["domain:Example.COM.", normalize_lead("domain", "example.com").id])
def test_a_known_lead_without_records_has_no_records(state, capsys, lead) -> None:
    state.add_lead(normalize_lead("domain", "example.com"), case_id="case-1")
    assert main(["records", "--lead", lead]) == 0
    assert capsys.readouterr().out == "no records\n"


def _request(lead_id: str, run_id: str, at_s: float) -> FetchEvent:
    return FetchEvent(source="robust", lead_id=lead_id, identity_id="direct", url="http://127.0.0.1/x", method="GET",
                      status=200, outcome=Outcome.OK, latency_ms=5.0, bytes=10, attempt=1,
                      at=datetime.fromtimestamp(at_s, UTC), run_id=run_id)


def test_leads_runs_names_every_run_that_collected_a_lead_and_links_the_runs_page_to_them(
        state, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_UI_URL", "https://dagster.example/")
    lead, other = normalize_lead("domain", "runs.example"), normalize_lead("domain", "other.example")
    state.add_leads([lead, other], case_id="c-runs")
    # A batch run of both leads, then a run of the lead alone; a run of the other lead is not its.
    state.record_fetches([_request(lead.id, "run-batch", 100.0), _request(other.id, "run-batch", 100.5),
                          _request(lead.id, "run-batch", 101.0), _request(lead.id, "run-alone", 200.0),
                          _request(other.id, "run-other", 300.0)])
    assert main(["leads", "runs", "domain:runs.example"]) == 0
    out = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("│")] for line in out.splitlines() if "run-" in line and "│" in line]
    assert [(row[0], row[1], row[4]) for row in rows] == [("robust", "run-batch", "2"), ("robust", "run-alone", "1")]
    assert "On the Runs page: https://dagster.example/runs?q%5B%5D=id%3Arun-batch&q%5B%5D=id%3Arun-alone" in out
    assert main(["leads", "runs", "domain:other.example", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [row["run_id"] for row in answer["runs"]] == ["run-batch", "run-other"]


def test_leads_runs_of_a_lead_never_collected_says_so(state, capsys) -> None:
    lead = normalize_lead("domain", "never.example")
    state.add_leads([lead], case_id="c-runs")
    assert main(["leads", "runs", "domain:never.example"]) == 0
    assert capsys.readouterr().out.strip() == f"no run has collected {lead.id}"


def test_leads_runs_names_the_run_of_a_collection_that_failed_before_its_first_request(state, capsys) -> None:
    lead = normalize_lead("domain", "unsent.example")
    state.add_leads([lead], case_id="c-runs")
    state.complete_collection(source="robust", lead_id=lead.id, outcome="failed", records=0, content_hash=None,
                              path=None, run_id="run-unsent")
    assert main(["leads", "runs", "domain:unsent.example", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["runs"]
    assert (row["source"], row["run_id"], row["requests"]) == ("robust", "run-unsent", 0)
