"""Operators see each lead's cadence: its estimated changes a day, when it is next due, and why
(a fixed cadence, a learned one within its bounds, or none for a lead only closed cases hold)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest

from investigations.cli import main
from investigations.intake.leads import normalize_lead
from investigations.scheduling.cadence import why
from investigations.scheduling.dispatch import lead_cadences
from investigations.sources.specs import parse_sources
from investigations.store import StateStore

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _spec(recrawl: str):
    return parse_sources("sources:\n  - {name: learned, adapter: json_api, lead_kinds: [domain], "
                         f"request: {{url: 'https://l.example/{{value}}'}}, {recrawl}}}\n").get("learned")


LEARNED = _spec("recrawl: {min: 1h, max: 30d, every: 6h}")
FIXED = _spec("recrawl_every: 6h")


@pytest.mark.parametrize("spec, rate_per_day, interval_s, open_case, expected", [
    (FIXED, 4.0, 6 * 3600, True, "fixed cadence: every 6 h"),
    (LEARNED, 4.0, 6 * 3600, True, "changes about 4 time(s) a day, so every 6 h"),
    (LEARNED, 100.0, 3600, True, "(its min: it changes faster than the source looks, 1 h)"),
    (LEARNED, 0.001, 30 * 86400, True, "(its max, 30 d)"),
    (LEARNED, 1.0, 12 * 3600, False, "(closed cases only: weighs less)"),
    (LEARNED, 1.0, math.inf, False, "not collected again: only closed cases hold it"),
])
def test_why_says_what_sets_a_lead_s_interval(spec, rate_per_day, interval_s, open_case, expected) -> None:
    assert expected in why(spec, rate_per_s=rate_per_day / 86400, interval_s=interval_s, open_case=open_case)


def test_a_lead_changing_often_is_due_sooner_than_one_that_never_changes(sqlite_store: StateStore) -> None:
    store = sqlite_store
    busy, calm = normalize_lead("domain", "busy.example"), normalize_lead("domain", "calm.example")
    for lead in (busy, calm):
        store.add_lead(lead, case_id="case-1")
    for hour in range(0, 48, 6):  # a visit every 6 h for two days: busy changed each time, calm never
        at = NOW - timedelta(hours=48 - hour)
        for lead, content in ((busy, f"b{hour}"), (calm, "same")):
            store.complete_collection(source="learned", lead_id=lead.id, outcome="ok", records=1, content_hash=content,
                                      path="p", run_id=None, now=at, change_prior_s=LEARNED.recrawl.prior_s)
    views = lead_cadences(store, LEARNED, now=NOW)
    assert views[busy.id].changes_per_day > 1 > views[calm.id].changes_per_day
    assert views[busy.id].interval_s < views[calm.id].interval_s
    assert views[busy.id].next_due is not None and views[busy.id].next_due < views[calm.id].next_due
    assert "a day, so every" in views[busy.id].why


def test_leads_list_shows_each_lead_s_cadence_per_source(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(tmp_path))
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    lead = normalize_lead("domain", "example.com")
    store.add_lead(lead, case_id="case-1")
    store.complete_collection(source="robust", lead_id=lead.id, outcome="ok", records=2, content_hash="h", path="p",
                              run_id=None, now=datetime.now(UTC))
    assert main(["leads", "list", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    cadence = row["collections"]["robust"]["cadence"]
    assert cadence["why"] == "fixed cadence: every 6 h" and cadence["interval_s"] == 6 * 3600
    assert main(["leads", "list", "--cadence"]) == 0
    out = capsys.readouterr().out
    assert lead.id in out and "fixed cadence: every 6 h" in out
    store.close()
