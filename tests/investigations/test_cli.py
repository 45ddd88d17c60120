"""The `investigations` command reads the state store an operator points it at."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from investigations.cli import main
from investigations.events import Outcome
from investigations.pacing import Circuits, GapSampler, RateLanes, source_lane
from investigations.specs import load_sources
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
    assert "flaky" in out and "domain-1" in out and "transient" in out and "attempts 4" in out


def test_dlq_requeue_twice_queues_once_and_says_so(state, capsys) -> None:
    assert main(["dlq", "requeue", "--source", "flaky"]) == 0
    assert "requeued 1 of 1" in capsys.readouterr().out
    assert main(["dlq", "requeue", "--source", "flaky"]) == 0
    assert "requeued 0 of 1 matching dead letter(s); 1 already queued" in capsys.readouterr().out
    assert state.queue_depths()["flaky"]["ready"] == 1
    main(["dlq", "list"])
    assert "[requeued]" in capsys.readouterr().out


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
    from investigations.leads import normalize_lead

    state.add_lead(normalize_lead("domain", "example.com"), case_id="case-7")
    assert main(["cases", "close", "case-7"]) == 0
    assert "case case-7 is closed" in capsys.readouterr().out
    main(["cases", "list"])
    assert "closed" in capsys.readouterr().out
    assert main(["cases", "reopen", "case-7"]) == 0
    assert state.cases_overview()[0]["status"] == "active"
    assert main(["cases", "close", "nope"]) == 2


def test_backfill_queues_every_lead_the_source_takes_once_a_day(state, monkeypatch, capsys) -> None:
    from investigations.leads import normalize_lead

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
