"""The recurring sensor's summary: what each source's pass queued, skipped or is waiting on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from investigations.scheduling.dispatch import RecurringPlan
from sensors.recurring import about, describe, queued_any

SINCE = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)


def test_a_tick_s_summary_says_whose_canaries_fail_and_what_their_recovery_queued_again() -> None:
    assert describe(RecurringPlan("robust", 1, 3, 3)) == "robust: 3 due, 3 queued"
    assert describe(RecurringPlan("quiet", 1, 0, 0, failing_since=SINCE)) == (
        "quiet: 0 due, 0 queued (canaries failing since 2026-12-02 02:00 UTC)")
    assert describe(RecurringPlan("quiet", 1, 0, 0, recovered=12)) == (
        "quiet: 0 due, 0 queued, 12 empty or failed during its canary incident queued again")
    assert describe(RecurringPlan("quiet", 1, 0, 0, "budget: spent 1.00 of 1.00 USD today", failing_since=SINCE)) == (
        "quiet: skipped, budget: spent 1.00 of 1.00 USD today (canaries failing since 2026-12-02 02:00 UTC)")


def test_a_learned_cadence_says_its_median_interval_and_a_short_budget() -> None:
    assert describe(RecurringPlan("changing", 1, 4, 4, median_interval_s=52_345.0)) == (
        "changing: 4 due, 4 queued, learned cadence median 14.5h")
    assert describe(RecurringPlan("changing", 1, 2, 2, median_interval_s=2_592_000.0, budget_short=True)) == (
        "changing: 2 due, 2 queued, learned cadence median 30d (budget short: every lead at its max)")


@pytest.mark.parametrize(("seconds", "text"), [(2_592_000.0, "30d"), (216_000.0, "2.5d"), (3_600.0, "1h"),
                                               (2_700.0, "45m"), (42.4, "42s")])
def test_a_cadence_reads_to_a_tenth_of_its_unit(seconds: float, text: str) -> None:
    assert about(seconds) == text


def test_a_tick_s_summary_counts_the_canaries_it_queued() -> None:
    assert describe(RecurringPlan("robust", 1, 0, 0, canaries=1)) == "robust: 0 due, 0 queued, 1 canary lead(s) queued"


def test_only_a_tick_that_queued_something_is_said_on_the_console() -> None:
    idle = [RecurringPlan("robust", 1, 0, 0), RecurringPlan("quiet", 1, 0, 0, "budget: spent")]
    assert not queued_any(idle)
    for busy in (RecurringPlan("robust", 1, 2, 2), RecurringPlan("robust", 1, 0, 0, canaries=1),
                 RecurringPlan("robust", 1, 0, 0, recovered=3)):
        assert queued_any([*idle, busy])
