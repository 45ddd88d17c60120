"""Silent degradation: each judgement, table-tested on plain values, and a source judged from its store."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from investigations.collection.events import FetchEvent, Outcome
from investigations.fleet.degradation import (
    CanaryState,
    Volume,
    answer_verdict,
    block_rate_verdict,
    canary_verdict,
    follow_canaries,
    freshness_verdict,
    judge_source,
    missing_fields,
    stale_after_s,
    volume_verdict,
)
from investigations.intake.leads import normalize_lead
from investigations.sources.specs import load_sources, parse_sources
from investigations.store import SourceIncident, StateStore

ROOT = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
FIELDS = ["type", "value", "first_seen"]


@pytest.mark.parametrize(
    ("records", "expected_min", "baseline", "fields", "passed", "severity", "says"),
    [
        (0, 1, [], FIELDS, False, "error", "at least 1 expected"),
        (0, 0, [], FIELDS, True, "error", "usual"),  # a source where no result is a result
        (2, 1, [20, 18, 22, 19, 21], FIELDS, False, "warn", "recent median (20)"),
        (2, 1, [20, 18, 22, 19], FIELDS, True, "error", "usual"),  # too few earlier answers to judge
        (6, 1, [20, 18, 22, 19, 21], FIELDS, True, "error", "usual"),
        (0, 0, [0, 0, 0, 0, 0], FIELDS, True, "error", "usual"),  # a source that never finds anything
        (20, 1, [20] * 5, ["type", "value"], False, "warn", "first_seen"),
    ],
)
def test_an_answer_is_judged_against_the_fixed_minimum_then_the_source_s_own_baseline(
    records, expected_min, baseline, fields, passed, severity, says
) -> None:
    verdict = answer_verdict(records=records, expected_min=expected_min, baseline=baseline, fields=fields,
                             baseline_fields=[FIELDS] * 5)
    assert (verdict.passed, verdict.severity) == (passed, severity)
    assert says in verdict.description


@pytest.mark.parametrize(
    ("baseline_fields", "missing"),
    [
        ([FIELDS] * 5, ["first_seen"]),
        ([FIELDS] * 4, []),  # not yet known to be always there
        ([FIELDS] * 4 + [["type", "value"]], []),  # one earlier answer lacked it: not "always"
        ([FIELDS] * 4 + [None, FIELDS], ["first_seen"]),  # rows from before fields were kept are skipped
    ],
)
def test_a_field_is_missing_only_when_the_source_s_answers_always_had_it(baseline_fields, missing) -> None:
    assert missing_fields(["type", "value"], baseline_fields) == missing


@pytest.mark.parametrize(
    ("recent", "baseline", "passed", "severity"),
    [
        ({"ok": 90, "blocked": 10}, {"ok": 1000}, True, "warn"),  # 10 %: under the 20 % floor
        ({"ok": 70, "blocked": 20, "throttled": 10}, {"ok": 1000}, False, "warn"),  # 30 %, from 0
        ({"ok": 70, "throttled": 30}, {"ok": 800, "throttled": 200}, True, "warn"),  # 30 % against 20 %: usual
        ({"ok": 10, "blocked": 90}, {"ok": 1000}, False, "error"),
        ({"blocked": 10}, {}, True, "warn"),  # too few requests to judge
    ],
)
def test_a_spike_of_refusals_warns_and_near_total_refusal_is_an_error(recent, baseline, passed, severity) -> None:
    verdict = block_rate_verdict(recent, baseline)
    assert (verdict.passed, verdict.severity) == (passed, severity)


@pytest.mark.parametrize(
    ("recent", "passed", "says"),
    [
        (Volume(10, 0, 200, 4000.0), True, "records per collection"),
        (Volume(10, 6, 40, 4000.0), False, "4.00 records per collection recently, against 20.00"),
        (Volume(10, 0, 200, 1500.0), False, "bytes"),
        (Volume(3, 3, 0, 100.0), True, "too few"),
    ],
)
def test_a_drop_of_records_or_answer_size_against_the_week_before_warns(recent, passed, says) -> None:
    verdict = volume_verdict(recent, Volume(50, 0, 1000, 4000.0))
    assert verdict.passed is passed and says in verdict.description


def test_freshness_counts_only_leads_collected_with_records_within_the_cadence() -> None:
    monitored = [("a", NOW - timedelta(hours=1)), ("b", NOW - timedelta(hours=30)), ("c", None),
                 ("d", NOW - timedelta(hours=2))]
    verdict = freshness_verdict(monitored, cadence_s=6 * 3600, now=NOW)
    assert (verdict.passed, verdict.severity) == (False, "warn")
    assert verdict.observed == 0.5 and verdict.details["stale_leads"] == 2
    assert verdict.examples[0] == "c"  # never collected with records: the stalest
    assert verdict.details["stalest_age_s"] == 30 * 3600
    assert verdict.details["never_collected_with_records"] == 1


@pytest.mark.parametrize(
    ("ages_h", "passed", "severity"),
    [([1] * 10, True, "warn"), ([1] * 9 + [30], True, "warn"), ([1] * 8 + [30] * 2, False, "warn"),
     ([1] * 4 + [30] * 6, False, "error"), ([], True, "warn")],
)
def test_freshness_warns_under_90_percent_and_fails_as_an_error_under_half(ages_h, passed, severity) -> None:
    monitored = [(f"l{i}", NOW - timedelta(hours=h)) for i, h in enumerate(ages_h)]
    verdict = freshness_verdict(monitored, cadence_s=6 * 3600, now=NOW)
    assert (verdict.passed, verdict.severity) == (passed, severity)


LEARNED_MAX_S = 30 * 86400


@pytest.mark.parametrize(
    ("interval_h", "age_h", "fresh"),
    [
        pytest.param(2, 1, True, id="within-its-interval"),
        pytest.param(2, 2.9, True, id="late-within-half-its-interval"),
        # Overdue against its own interval though well within recrawl.max: stale.
        pytest.param(2, 4, False, id="overdue-within-max"),
        pytest.param(48, 60, True, id="long-interval-late-within-half"),
        pytest.param(48, 73, False, id="long-interval-overdue"),
        # A short interval's grace is at least one window (1 h here), not half of 20 min.
        pytest.param(1 / 3, 1.2, True, id="short-interval-within-a-window"),
        pytest.param(1 / 3, 1.4, False, id="short-interval-past-a-window"),
    ],
)
def test_on_a_learned_cadence_a_lead_is_held_to_its_own_interval_plus_its_grace_not_to_max(
    interval_h: float, age_h: float, fresh: bool
) -> None:
    verdict = freshness_verdict([("a", NOW - timedelta(hours=age_h))], cadence_s=LEARNED_MAX_S, now=NOW,
                                intervals_s={"a": interval_h * 3600}, window_s=3600)
    assert verdict.passed is fresh and verdict.details["stale_leads"] == (0 if fresh else 1)


@pytest.mark.parametrize(
    ("interval_s", "window_s", "allowed_s"),
    [(7200, 3600, 10_800), (86_400, 3600, 129_600), (1200, 3600, 4800), (3600, 3600, 7200)],
)
def test_a_learned_lead_s_grace_is_half_its_interval_and_at_least_one_window(interval_s, window_s, allowed_s) -> None:
    assert stale_after_s(interval_s, window_s=window_s) == allowed_s


def test_on_a_learned_cadence_a_lead_the_plan_leaves_out_is_held_to_max_and_the_verdict_names_its_rule() -> None:
    monitored = [("planned", NOW - timedelta(days=3)), ("left-out", NOW - timedelta(days=29)),
                 ("overdue", NOW - timedelta(days=31))]
    verdict = freshness_verdict(monitored, cadence_s=LEARNED_MAX_S, now=NOW, window_s=3600,
                                intervals_s={"planned": 86_400.0, "overdue": 86_400.0})
    assert verdict.examples == ["overdue", "planned"]  # most overdue first; left-out is within max
    assert "their own planned interval" in verdict.description
    assert str(verdict.details["rule"]).startswith("learned cadence") and verdict.details["median_interval_s"] == 86_400
    fixed = freshness_verdict(monitored, cadence_s=LEARNED_MAX_S, now=NOW)
    assert fixed.examples == ["overdue"] and "fixed cadence" in fixed.description
    assert str(fixed.details["rule"]).startswith("fixed cadence") and fixed.details["cadence_s"] == LEARNED_MAX_S


@pytest.mark.parametrize(
    ("canaries", "passed"),
    [
        ([CanaryState("domain:a", "ok", 3)], True),
        ([CanaryState("domain:a", None, 0)], True),  # not collected yet: nothing to say
        ([CanaryState("domain:a", "ok", 3), CanaryState("domain:b", "empty", 0)], False),
        ([CanaryState("domain:a", "failed", 3, dead_letter=True)], False),
        ([], True),
    ],
)
def test_a_canary_without_records_fails_the_source(canaries, passed) -> None:
    verdict = canary_verdict(canaries, expected_min=1)
    assert verdict.passed is passed and verdict.severity == "error"
    if not passed:
        assert verdict.examples


@pytest.mark.parametrize(
    "canaries",
    [[CanaryState("domain:a", None, 0)], [CanaryState("domain:a", "ok", 3), CanaryState("domain:b", None, 0)], []],
)
def test_canaries_not_all_collected_yet_are_not_judged(canaries) -> None:
    verdict = canary_verdict(canaries, expected_min=1)
    assert not verdict.judged  # the check is not reported: it never reads Passed on no evidence


def test_a_canary_that_failed_is_judged_even_while_another_waits() -> None:
    verdict = canary_verdict([CanaryState("domain:a", "empty", 0), CanaryState("domain:b", None, 0)], expected_min=1)
    assert verdict.judged and not verdict.passed


def _at(hours: float) -> datetime:
    return NOW + timedelta(hours=hours)


def _canary(outcome: str | None, records: int, hours: float | None, *, lead: str = "domain:a",
            dead_letter: bool = False) -> CanaryState:
    return CanaryState(lead, outcome, records, dead_letter, None if hours is None else _at(hours))


PASSED = SourceIncident("s", passed_at=_at(0))
OPEN = SourceIncident("s", passed_at=_at(0), started_at=_at(2), since=_at(0))
ENDED = replace(OPEN, passed_at=_at(3), ended_at=_at(3))
REQUEUED = replace(ENDED, requeued_at=_at(3.1))


@pytest.mark.parametrize(
    ("before", "canaries", "after"),
    [
        pytest.param(None, [_canary(None, 0, None)], SourceIncident("s"), id="nothing-collected-yet"),
        pytest.param(None, [_canary("ok", 2, 0)], PASSED, id="a-pass-is-remembered"),
        pytest.param(PASSED, [_canary("ok", 2, 1)], replace(PASSED, passed_at=_at(1)), id="the-latest-pass"),
        pytest.param(PASSED, [_canary("empty", 0, 2)], OPEN, id="an-empty-answer-opens-it-after-the-pass"),
        pytest.param(PASSED, [_canary("failed", 0, 2, dead_letter=True)], OPEN, id="a-failure-opens-it"),
        pytest.param(None, [_canary("empty", 0, 2)], SourceIncident("s", started_at=_at(2)), id="no-pass-on-record"),
        pytest.param(OPEN, [_canary("empty", 0, 2.5)], OPEN, id="a-later-failure-changes-nothing"),
        pytest.param(OPEN, [_canary("ok", 2, 3)], ENDED, id="a-pass-ends-it"),
        pytest.param(OPEN, [_canary("ok", 2, 3), _canary("empty", 0, 2.5, lead="domain:b")], OPEN,
                     id="not-while-another-canary-fails"),
        pytest.param(OPEN, [_canary("ok", 2, 3), _canary(None, 0, None, lead="domain:b")], ENDED,
                     id="one-not-collected-yet-does-not-hold-it-open"),
        pytest.param(ENDED, [_canary("empty", 0, 5)], replace(ENDED, started_at=_at(5), ended_at=None),
                     id="a-new-one-before-the-requeue-keeps-the-old-window"),
        pytest.param(REQUEUED, [_canary("empty", 0, 5)],
                     replace(REQUEUED, started_at=_at(5), since=_at(3), ended_at=None, requeued_at=None),
                     id="a-new-one-after-the-requeue-starts-after-the-last-pass"),
    ],
)
def test_a_source_s_incident_runs_from_its_first_failing_canary_to_the_pass_that_follows(
    before, canaries, after
) -> None:
    assert follow_canaries(before, canaries, source="s", expected_min=1) == after


def test_a_canary_short_of_the_source_s_minimum_fails_like_an_empty_one() -> None:
    followed = follow_canaries(PASSED, [_canary("ok", 2, 2)], source="s", expected_min=3)
    assert followed == OPEN


def test_no_monitored_lead_is_not_judged_fresh() -> None:
    assert not freshness_verdict([], cadence_s=3600, now=NOW).judged



@pytest.fixture
def store(sandbox_env):
    made = StateStore.from_url(f"sqlite:///{sandbox_env / 'state.db'}")
    yield made
    made.close()


def _fetch(source: str, outcome: Outcome, at: datetime, status: int = 200) -> FetchEvent:
    return FetchEvent(source=source, lead_id="l", identity_id="direct", url="http://x/", method="GET", status=status,
                      outcome=outcome, latency_ms=5.0, bytes=100, attempt=1, at=at)


def test_a_silently_empty_source_is_judged_stale_and_its_canary_failing_from_the_store(store) -> None:
    quiet = load_sources(ROOT / "sources.yaml").get("quiet")
    for value in ("a.example", "b.example"):
        lead = normalize_lead("domain", value)
        store.add_lead(lead, case_id="case-1")
        store.complete_collection(source="quiet", lead_id=lead.id, outcome="empty", records=0, content_hash="h",
                                  path="/p", run_id="r", now=NOW - timedelta(minutes=5))
    canary = quiet.canaries[0].lead
    store.add_lead(canary)
    store.complete_collection(source="quiet", lead_id=canary.id, outcome="empty", records=0, content_hash="h",
                              path="/p", run_id="r", now=NOW - timedelta(minutes=5))
    store.record_fetches([_fetch("quiet", Outcome.BLOCKED, NOW - timedelta(minutes=1), 403)] * 30)
    verdicts = judge_source(store, quiet, now=NOW)
    assert verdicts["fresh"].passed is False and verdicts["fresh"].details["monitored_leads"] == 2  # the canary is in no case
    assert verdicts["canaries"].passed is False and "canary.example" in verdicts["canaries"].examples[0]
    assert verdicts["refusals"].passed is False and verdicts["refusals"].severity == "error"


LEARNED = parse_sources("""
sources:
  - name: learned
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://learned.example/api?q={value}"}
    recrawl: {min: 1h, max: 30d, every: 6h}
""").get("learned")


def test_a_learned_source_judges_each_lead_against_its_own_cadence_from_the_store(store) -> None:
    learned = LEARNED
    busy, calm = normalize_lead("domain", "busy.example"), normalize_lead("domain", "calm.example")
    for lead in (busy, calm):
        store.add_lead(lead, case_id="case-1")
    # Visited every 6 h for two days until 12 h ago: busy changed each time, calm never.
    for hour in range(0, 48, 6):
        at = NOW - timedelta(hours=54 - hour)
        for lead, content in ((busy, f"b{hour}"), (calm, "same")):
            store.complete_collection(source="learned", lead_id=lead.id, outcome="ok", records=1, content_hash=content,
                                      path="/p", run_id="r", now=at, change_prior_s=learned.recrawl.prior_s)
    verdict = judge_source(store, learned, now=NOW)["fresh"]
    # Both were last collected 12 h ago, far within recrawl.max (30 d): busy's own interval (under 4 h,
    # so stale after under 6 h) is long past, calm's (over 16 h) is not.
    assert (verdict.passed, verdict.examples, verdict.details["stale_leads"]) == (False, [busy.id], 1)
    assert "their own planned interval" in verdict.description


@pytest.mark.parametrize(("spent", "budget", "passed"), [(1.0, 5.0, True), (5.0, 5.0, False), (7.5, 5.0, False)])
def test_a_spent_budget_warns_that_background_work_waits(spent, budget, passed) -> None:
    from investigations.fleet.degradation import budget_verdict

    verdict = budget_verdict(spent, budget)
    assert (verdict.passed, verdict.severity) == (passed, "warn")
    if not passed:
        assert "interactive leads still run" in verdict.description
