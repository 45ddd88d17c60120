"""Rate lanes across processes: six spawned workers share one lane through SQLite or Postgres.

Real clock, real GapSampler. The exact checks come first: sorted by time, every slot opens no
earlier than the previous one plus the interval (no lost update between processes) and the lane
never idles for long (the workers keep it busy). Then the sends (each a jittered delay after its
slot) against the permitted rate, with the slack the delay allows (WINDOW_SLACK, SECOND_SLACK).
"""

from __future__ import annotations

import bisect
import itertools
import multiprocessing
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from investigations.pacing import GapSampler, RateLanes
from investigations.pacing.lanes import LaneSpec
from investigations.store import StateStore

ROOT = Path(__file__).resolve().parents[3]
WORKERS = 6
RATE_PER_S = 20.0
BURST = 1
WINDOW_S = 2.5
LANE = LaneSpec("source:shared", RATE_PER_S, BURST)
INTERVAL_S = 1 / RATE_PER_S
# Slots are exact; a send leaves at most one interval after its slot, so a window can hold at most
# one send more than its slots. Anything racy would show as a multiple.
WINDOW_SLACK = 1
SECOND_SLACK = 1


class _RecordingClock:
    last = 0.0

    def __call__(self) -> float:
        self.last = time.time()
        return self.last


def _pace(url: str, schema: str | None, worker: int, barrier: Any, results: Any) -> None:
    """Run in a spawned process: reserve, sleep the wait, "send"; report slots, gaps and send times."""
    store = StateStore.from_url(url, schema=schema)
    try:
        # Pauses (3-10 intervals) are off: a few of them would decide a 2.5 s window on their own.
        # Their share of the mean is checked in test_jitter.
        # Seeded per worker: a run is reproducible up to how the processes interleave.
        sampler = GapSampler(random.Random(worker), pause_probability=0.0)
        clock = _RecordingClock()
        lanes = RateLanes(store, sampler=sampler, clock=clock)
        lanes.state(LANE.name)  # connect before the start line
        barrier.wait(60)
        start = time.time()
        slots: list[float] = []  # when the lane let each request go, before its jitter
        sends: list[float] = []
        granted = True
        while time.time() < start + WINDOW_S:
            reservation = lanes.reserve([LANE], max_wait_s=5.0)
            granted &= reservation.granted
            slots.append(clock.last + reservation.wait_s - reservation.delay_s)
            time.sleep(reservation.wait_s)
            sends.append(time.time())
        results.put((start, granted, slots, sends))
    finally:
        store.close()


@dataclass
class Run:
    start: float
    granted: bool
    slots: list[float]
    sends: list[float]


def run_workers(url: str, schema: str | None, monkeypatch: pytest.MonkeyPatch) -> Run:
    # Spawned children import this module by name; the project root on sys.path makes it importable.
    monkeypatch.syspath_prepend(str(ROOT))
    StateStore.from_url(url, schema=schema).close()  # migrate once up front, as the deployment does
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    workers = [ctx.Process(target=_pace, args=(url, schema, w, barrier, results)) for w in range(WORKERS)]
    for process in workers:
        process.start()
    reports = [results.get(timeout=60) for _ in workers]
    for process in workers:
        process.join(30)
    assert [process.exitcode for process in workers] == [0] * WORKERS
    return Run(
        start=min(r[0] for r in reports),
        granted=all(r[1] for r in reports),
        slots=sorted(slot for r in reports for slot in r[2]),
        sends=sorted(t for r in reports for t in r[3]),
    )


def test_six_processes_share_one_lane_at_the_permitted_rate(
    database: tuple[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, schema = database  # a SQLite file, or POSTGRES_URL with a fresh schema
    run = run_workers(url, schema, monkeypatch)

    assert run.granted
    # Exact: each slot opens no earlier than the previous one plus the interval.
    overlaps = [b - (a + INTERVAL_S) for a, b in itertools.pairwise(run.slots) if b < a + INTERVAL_S - 1e-5]
    assert overlaps == []
    # Busy: the lane idled (no reservation waiting) for under 10% of the window.
    in_window = [slot for slot in run.slots if slot <= run.start + WINDOW_S]
    idle_s = sum(max(0.0, b - (a + INTERVAL_S)) for a, b in itertools.pairwise(in_window))
    assert idle_s < 0.1 * WINDOW_S

    sends = [t for t in run.sends if run.start <= t <= run.start + WINDOW_S]
    permitted = RATE_PER_S * WINDOW_S
    assert 0.7 * permitted <= len(sends) <= permitted + BURST + WINDOW_SLACK, f"{len(sends)} sends"
    busiest_second = max(bisect.bisect_right(sends, t + 1.0) - i for i, t in enumerate(sends))
    assert busiest_second <= RATE_PER_S + BURST + SECOND_SLACK, f"{busiest_second} sends in one second"
