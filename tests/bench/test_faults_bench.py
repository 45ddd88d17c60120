"""The fault suite's soak judgement, process-free: when the kills fall, how memory growth and the
way back after Postgres' return are judged (the suite itself runs under `make faults` / `make soak`)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.faults import RSS_EVERY_S, RSS_MIN_JUDGED_S, RSS_WARMUP_S, RssSampler, spread, verdict


def test_kills_of_one_kind_are_spread_evenly_over_what_is_left_of_the_sending() -> None:
    assert spread(0.5, 2, 100) == [50.0, 75.0]
    assert spread(0.35, 1, 100) == [35.0]
    assert spread(0.5, 0, 100) == []


class _Fleet:
    procs: dict[str, Any] = {}


def _sampler(samples: dict[tuple[str, int], list[tuple[float, int]]], born: float = 0.0) -> RssSampler:
    sampler = RssSampler(_Fleet())  # type: ignore[arg-type]
    sampler.samples = samples
    sampler.born = {key: born for key in samples}
    return sampler


def _life(first_mb: float, last_mb: float, lived_s: float) -> list[tuple[float, int]]:
    steps = int(lived_s / RSS_EVERY_S)
    return [(n * RSS_EVERY_S, int((first_mb + (last_mb - first_mb) * n / steps) * 2**20)) for n in range(steps + 1)]


def test_memory_growth_is_judged_from_the_warm_up_not_the_start() -> None:
    lived = RSS_WARMUP_S + RSS_MIN_JUDGED_S + 60
    # Grows 100 -> 300 MB in all, but the growth after the warm-up is what counts.
    figures = _sampler({("daemon", 1): _life(100, 300, lived)}).figures()["daemon"]
    assert figures["judged"] == 1
    warm_share = RSS_WARMUP_S / lived
    first = 100 + 200 * warm_share
    assert figures["max_growth"] == pytest.approx(300 / first - 1, rel=0.02)


def test_a_process_that_did_not_live_long_enough_after_its_warm_up_is_not_judged() -> None:
    figures = _sampler({("daemon", 1): _life(100, 100, RSS_WARMUP_S + RSS_MIN_JUDGED_S / 2)}).figures()["daemon"]
    assert figures["judged"] == 0 and figures["max_growth"] is None


def _figures(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "lost": 0, "duplicates": 0, "files_differing_from_undisturbed": 0, "files_missing": 0, "runs_stuck": 0,
        "leases_held_past_ttl": 0, "time_to_recover_s": 100.0, "intake_kills": [{}],
        "intake_redeliveries_all_duplicates": 1, "daemon_kill": {"runs_started_after_restart": 3},
        "code_server_kill": {"restarted_after_s": 40.0}, "postgres_outage": {"runs_started_after_restart": 5},
        "evidence": {w: {"recovered": 1} for w in ("launch", "step", "after_write")},
        "config": {"pg_restarts": 2},
        "postgres_outages": [{"intake_back_after_s": 1.0, "first_sensor_tick_after_s": 4.0,
                              "first_run_launched_after_s": 5.0, "first_run_started_after_s": 9.0}] * 2,
        "rss": {"daemon": {"judged": 1, "max_growth": 0.04, "processes": [{}]},
                "intake": {"judged": 1, "max_growth": 0.02, "processes": [{}]}},
    }
    base.update(changes)
    return base


def test_a_soak_passes_when_every_process_is_back_in_time_and_memory_holds() -> None:
    assert verdict(_figures(), postgres=True, soak=True)["passed"]


@pytest.mark.parametrize("change", [
    {"postgres_outages": [{"intake_back_after_s": 1.0, "first_sensor_tick_after_s": 12.0,
                           "first_run_launched_after_s": 5.0}] * 2},
    {"postgres_outages": [{"intake_back_after_s": 1.0, "first_sensor_tick_after_s": 4.0,
                           "first_run_launched_after_s": 11.0}] * 2},
    {"postgres_outages": [{"intake_back_after_s": 1.0, "first_sensor_tick_after_s": 4.0,
                           "first_run_launched_after_s": None}] * 2},
    {"postgres_outages": [{"intake_back_after_s": 1.0, "first_sensor_tick_after_s": 4.0,
                           "first_run_launched_after_s": 5.0}]},
    {"rss": {"daemon": {"judged": 1, "max_growth": 0.12, "processes": [{}]},
             "intake": {"judged": 1, "max_growth": 0.02, "processes": [{}]}}},
    {"rss": {"daemon": {"judged": 0, "max_growth": None, "processes": [{}]},
             "intake": {"judged": 1, "max_growth": 0.02, "processes": [{}]}}},
], ids=["a sensor tick late", "a run launched late", "no run after a return", "one restart short", "daemon memory grew",
        "daemon memory never judged"])
def test_a_soak_fails_on_a_late_return_missing_restart_or_memory_growth(change: dict[str, Any]) -> None:
    result = verdict(_figures(**change), postgres=True, soak=True)
    assert not result["passed"]
    assert verdict(_figures(**change), postgres=True, soak=False)["passed"]  # the fault suite does not judge them


def test_a_run_worker_slow_to_start_after_a_return_does_not_fail_the_soak() -> None:
    # The daemon launched a run 5 s after Postgres came back; its new worker started 14 s after.
    outages = [{"intake_back_after_s": 1.0, "first_sensor_tick_after_s": 4.0, "first_run_launched_after_s": 5.0,
                "first_run_started_after_s": 14.0}] * 2
    assert verdict(_figures(postgres_outages=outages), postgres=True, soak=True)["passed"]
