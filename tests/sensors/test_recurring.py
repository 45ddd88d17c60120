"""The recurring sensor's summary: what each source's pass queued, skipped or is waiting on."""

from __future__ import annotations

from datetime import UTC, datetime

from investigations.scheduling.dispatch import RecurringPlan
from sensors.recurring import describe

SINCE = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)


def test_a_tick_s_summary_says_whose_canaries_fail_and_what_their_recovery_queued_again() -> None:
    assert describe(RecurringPlan("robust", 1, 3, 3)) == "robust: 3 due, 3 queued"
    assert describe(RecurringPlan("quiet", 1, 0, 0, failing_since=SINCE)) == (
        "quiet: 0 due, 0 queued (canaries failing since 2026-12-02 02:00 UTC)")
    assert describe(RecurringPlan("quiet", 1, 0, 0, recovered=12)) == (
        "quiet: 0 due, 0 queued, 12 empty or failed during its canary incident queued again")
    assert describe(RecurringPlan("quiet", 1, 0, 0, "budget: spent 1.00 of 1.00 USD today", failing_since=SINCE)) == (
        "quiet: skipped, budget: spent 1.00 of 1.00 USD today (canaries failing since 2026-12-02 02:00 UTC)")
