"""Operators see each lead's cadence: its estimated changes a day, when it is next due, and why
(a fixed cadence, a learned one within its bounds, or none for a lead only closed cases hold); and
one lead's next visit as its materialization reads it, from its source's last plan."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest

from investigations.cli import main
from investigations.intake.leads import normalize_lead
from investigations.scheduling.cadence import why
from investigations.scheduling.dispatch import lead_cadences, next_visit, plan_recurring
from investigations.sources.specs import parse_sources
from investigations.store import StateStore

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _catalog(recrawl: str, extra: str = ""):
    return parse_sources("sources:\n  - {name: learned, adapter: json_api, lead_kinds: [domain], "
                         f"request: {{url: 'https://l.example/{{value}}'}}, {recrawl}{extra}}}\n")


def _spec(recrawl: str):
    return _catalog(recrawl).get("learned")


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


BUSY, CALM = normalize_lead("domain", "busy.example"), normalize_lead("domain", "calm.example")


def _busy_and_calm(store: StateStore, spec=LEARNED) -> None:
    """Two leads of an open case visited every 6 h for two days: busy changed each time, calm never."""
    for lead in (BUSY, CALM):
        store.add_lead(lead, case_id="case-1")
    for hour in range(0, 48, 6):
        at = NOW - timedelta(hours=48 - hour)
        for lead, content in ((BUSY, f"b{hour}"), (CALM, "same")):
            store.complete_collection(source=spec.name, lead_id=lead.id, outcome="ok", records=1,
                                      content_hash=content, path="p", run_id=None, now=at,
                                      change_prior_s=spec.recrawl.prior_s)


def test_a_lead_changing_often_is_due_sooner_than_one_that_never_changes(sqlite_store: StateStore) -> None:
    store = sqlite_store
    busy, calm = BUSY, CALM
    _busy_and_calm(store)
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


def test_one_lead_s_next_visit_is_what_the_source_s_last_plan_gave_it(sqlite_store: StateStore) -> None:
    _busy_and_calm(sqlite_store)
    plan_recurring(sqlite_store, _catalog("recrawl: {min: 1h, max: 30d, every: 6h}"), now=NOW)  # keeps the plan
    planned = lead_cadences(sqlite_store, LEARNED, now=NOW)
    for lead in (BUSY, CALM):
        alone = next_visit(sqlite_store, LEARNED, lead.id)
        assert alone is not None
        assert alone.interval_s == pytest.approx(planned[lead.id].interval_s)
        assert alone.next_due == planned[lead.id].next_due and alone.why == planned[lead.id].why


def test_a_learned_source_not_planned_yet_says_so_and_reads_every_lead_at_its_prior(sqlite_store: StateStore) -> None:
    _busy_and_calm(sqlite_store)
    view = next_visit(sqlite_store, LEARNED, CALM.id)
    assert view is not None and "not planned yet" in view.why and view.next_due is not None
    assert view.interval_s > LEARNED.recrawl.prior_s  # calm never changed: later than a lead at the prior


def test_a_plan_made_before_any_lead_is_not_kept_for_the_first_leads_to_read(sqlite_store: StateStore) -> None:
    plan_recurring(sqlite_store, _catalog("recrawl: {min: 1h, max: 30d, every: 6h}"), now=NOW)  # nothing monitored
    assert sqlite_store.cadence_plan(LEARNED.name) is None
    _busy_and_calm(sqlite_store)
    view = next_visit(sqlite_store, LEARNED, CALM.id)
    assert view is not None and "not planned yet" in view.why
    assert view.interval_s > LEARNED.recrawl.min_s  # not every lead at its min


@pytest.mark.parametrize(
    ("spec", "arrange", "interval_s", "says"),
    [
        pytest.param(FIXED, lambda store: None, 6 * 3600, "fixed cadence: every 6 h", id="fixed"),
        pytest.param(LEARNED, lambda store: store.set_case_status("case-1", "closed"), math.inf,
                     "not collected again: only closed cases hold it", id="closed-case"),
        pytest.param(LEARNED, lambda store: store.put_dead_letter(
            source="learned", lead_id=CALM.id, reason_group="transient", last_status=500, attempts=4,
            last_error="HTTP 500", now=NOW), math.inf, "not collected again: a dead letter", id="dead-letter"),
    ],
)
def test_one_lead_s_next_visit_says_why_and_none_when_it_is_not_collected_again(
    sqlite_store: StateStore, spec, arrange, interval_s: float, says: str
) -> None:
    _busy_and_calm(sqlite_store, spec)
    arrange(sqlite_store)
    view = next_visit(sqlite_store, spec, CALM.id)
    assert view is not None and view.interval_s == interval_s and says in view.why
    last = NOW - timedelta(hours=6)
    assert view.next_due == (None if interval_s == math.inf else last + timedelta(seconds=interval_s))


def test_a_lead_no_case_holds_is_not_collected_again_but_a_canary_is_on_its_own_rule(sqlite_store: StateStore) -> None:
    spec = _catalog("recrawl_every: 6h", ", expected_min_records: 1, "
                    "canaries: [{kind: domain, value: canary.example}]").get("learned")
    canary, loose = spec.canaries[0].lead, normalize_lead("domain", "loose.example")
    for lead, records in ((canary, 0), (loose, 2)):
        sqlite_store.add_lead(lead)
        sqlite_store.complete_collection(source="learned", lead_id=lead.id, outcome="ok" if records else "empty",
                                         records=records, content_hash="h", path="p", run_id=None, now=NOW)
    loose_view, canary_view = next_visit(sqlite_store, spec, loose.id), next_visit(sqlite_store, spec, canary.id)
    assert loose_view is not None and loose_view.next_due is None and "no case holds it" in loose_view.why
    assert canary_view is not None and "canary whose answer failed: again in 5 min" in canary_view.why
    assert canary_view.next_due == NOW + timedelta(minutes=5)
    assert next_visit(sqlite_store, spec, BUSY.id) is None  # never collected by the source

