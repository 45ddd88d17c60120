"""The fetcher paces through the shared rate lanes, and a 429 waits instead of spending attempts."""

from __future__ import annotations

import random
import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import pairwise

import httpx
import pytest

from investigations.adapters import PlannedRequest
from investigations.collection.fetcher import Fetcher, FetchFailed, FetchParked
from investigations.identities import IdentityPool, parse_identities
from investigations.identities.sessions import IdentityBlocked, IdentitySession
from investigations.pacing import GapSampler, RateLanes
from investigations.pacing.jitter import (
    RHYTHM_GAPS,
    RHYTHM_MIN_CV,
    RHYTHM_SHORT_GAPS,
    RHYTHM_SHORT_MIN_CV,
    THINK_MEDIAN,
)
from investigations.pacing.lanes import source_lane
from investigations.sources.specs import SourceSpec

BASE = "http://127.0.0.1:8800"


class FakeTime:
    """One clock for the fetcher and the lanes; sleeping moves it forward."""

    def __init__(self) -> None:
        self.now_s = 1_000_000.0
        self.slept: list[float] = []
        self.on_sleep = lambda: None  # what happens elsewhere while the fetcher sleeps

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.on_sleep()
        self.slept.append(seconds)
        self.now_s += seconds


def spec(*, rate_per_s: float = 2.0, burst: int = 1, attempts: int = 2, park_after_s: float = 60.0,
         cut_hold_s: float = 2.0) -> SourceSpec:
    return SourceSpec.model_validate({
        "name": "fragile",
        "adapter": "json_api",
        "lead_kinds": ["domain"],
        "request": {"url": BASE + "/fragile/api/search?q={value}"},
        "rate": {"source_per_s": rate_per_s, "source_burst": burst, "identity_per_s": 100, "identity_burst": 100},
        "retry": {"attempts": attempts, "base_delay_s": 0.5, "max_delay_s": 2.0},
        "throttle": {"park_after_s": park_after_s, "cut_hold_s": cut_hold_s},
    })


def make_fetcher(
    store, time_: FakeTime, answers: list[httpx.Response], *, sampler: GapSampler | None = None
) -> tuple[Fetcher, RateLanes, list]:
    sent: list[float] = []
    replies = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(time_.now_s)
        return next(replies)

    # A nearly fixed gap makes the arithmetic exact; the jitter itself is tested in pacing/.
    sampler = sampler or GapSampler(random.Random(1), sigma=1e-6, pause_probability=0.0)
    lanes = RateLanes(store, sampler=sampler, clock=time_.clock)
    fetcher = Fetcher(sink=store, lanes=lanes, transport=httpx.MockTransport(handler), sleep=time_.sleep,
                      clock=time_.clock, now=lambda: datetime.fromtimestamp(time_.now_s, UTC), rng=random.Random(3))
    return fetcher, lanes, sent


REQUEST = PlannedRequest("GET", BASE + "/fragile/api/search?q=example.com", {})


def test_requests_on_one_lane_are_spaced_by_the_permitted_rate(sqlite_store) -> None:
    time_ = FakeTime()
    # The exact sampler: a nearly fixed gap is what the rhythm guard holds back (tested in pacing/).
    exact = GapSampler(random.Random(1), sigma=0.0, pause_probability=0.0)
    fetcher, _, sent = make_fetcher(sqlite_store, time_, [httpx.Response(200, json={"results": []})] * 5, sampler=exact)
    for _ in range(5):
        fetcher.fetch(spec(rate_per_s=2.0), REQUEST, lead_id="l1")
    gaps = [b - a for a, b in pairwise(sent)]
    assert all(gap >= 0.5 - 1e-3 for gap in gaps)
    assert sum(gaps) / len(gaps) <= 0.5 * 1.16


def test_a_429_does_not_spend_an_attempt_and_retry_after_is_a_floor(sqlite_store) -> None:
    time_ = FakeTime()
    answers = [httpx.Response(429, headers={"Retry-After": "7"})] * 3 + [httpx.Response(200, json={"results": []})]
    fetcher, _, sent = make_fetcher(sqlite_store, time_, answers)
    result = fetcher.fetch(spec(attempts=1), REQUEST, lead_id="l1")  # one attempt, yet three 429s survived
    assert result.status == 200 and result.attempts == 4
    assert all(b - a >= 7 for a, b in pairwise(sent))


def test_a_throttle_cuts_the_lane_rate_and_successes_raise_it_again(sqlite_store) -> None:
    time_ = FakeTime()
    answers = [httpx.Response(429)] + [httpx.Response(200, json={"results": []})] * 3
    fetcher, lanes, _ = make_fetcher(sqlite_store, time_, answers)
    fetcher.fetch(spec(), REQUEST, lead_id="l1")
    after_throttle_and_one_success = lanes.state("source:fragile").rate_factor
    assert after_throttle_and_one_success < 1.0
    fetcher.fetch(spec(), REQUEST, lead_id="l1")
    assert lanes.state("source:fragile").rate_factor > after_throttle_and_one_success


def test_throttled_for_longer_than_park_after_parks_instead_of_failing(sqlite_store) -> None:
    time_ = FakeTime()
    fetcher, _, sent = make_fetcher(sqlite_store, time_, [httpx.Response(429, headers={"Retry-After": "10"})] * 20)
    with pytest.raises(FetchParked) as parked:
        fetcher.fetch(spec(park_after_s=30), REQUEST, lead_id="l1")
    assert parked.value.last_status == 429 and parked.value.retry_in_s >= 10
    assert len(sent) <= 4  # never hammered the source while parked


def test_503_still_spends_attempts(sqlite_store) -> None:
    time_ = FakeTime()
    fetcher, _, _ = make_fetcher(sqlite_store, time_, [httpx.Response(503)] * 3)
    with pytest.raises(FetchFailed) as failed:
        fetcher.fetch(spec(attempts=2), REQUEST, lead_id="l1")
    assert failed.value.attempts == 2 and failed.value.reason_group == "throttled"


def test_an_identity_alone_on_a_busy_source_never_thinks_between_its_sends(sqlite_store) -> None:
    time_ = FakeTime()
    # The exact sampler: no rhythm guard either, so every sleep is a lane wait or a think (of 0 s).
    exact = GapSampler(random.Random(1), sigma=0.0, pause_probability=0.0)
    fetcher, _, sent = make_fetcher(sqlite_store, time_, [httpx.Response(200, json={"results": []})] * 6,
                                    sampler=exact)
    for _ in range(6):
        fetcher.fetch(spec(rate_per_s=2.0), REQUEST, lead_id="l1")
    assert len(time_.slept) == 6  # one lane wait per request, no think time: it waited for itself only


def test_an_identity_that_waited_behind_others_thinks_on_the_scale_of_its_period(sqlite_store) -> None:
    time_ = FakeTime()
    fetcher, lanes, sent = make_fetcher(sqlite_store, time_, [httpx.Response(200, json={"results": []})] * 3)
    source = spec(rate_per_s=2.0)
    fetcher.fetch(source, REQUEST, lead_id="l1")
    for _ in range(3):  # three other identities take the source's next slots
        lanes.reserve([source_lane(source)], max_wait_s=60)
    fetcher.fetch(source, REQUEST, lead_id="l1")  # waits ~3 intervals behind them
    period = sent[1] - sent[0]
    before = len(time_.slept)
    fetcher.fetch(source, REQUEST, lead_id="l1")
    think = time_.slept[before]
    assert len(time_.slept) == before + 2  # a think, then the lane wait
    assert think == pytest.approx(THINK_MEDIAN * period, rel=0.01)


def test_an_identity_s_sends_never_close_too_regular_a_run_of_gaps(sqlite_store) -> None:
    time_ = FakeTime()
    # The default sampler here is near-regular: without the rhythm guard every gap would be equal.
    fetcher, _, sent = make_fetcher(sqlite_store, time_, [httpx.Response(200, json={"results": []})] * 24)
    for _ in range(24):
        fetcher.fetch(spec(rate_per_s=2.0), REQUEST, lead_id="l1")
    gaps = [b - a for a, b in pairwise(sent)]
    for n, floor in ((RHYTHM_GAPS, RHYTHM_MIN_CV), (RHYTHM_SHORT_GAPS, RHYTHM_SHORT_MIN_CV)):
        windows = [gaps[i:i + n] for i in range(len(gaps) - n + 1)]
        assert min(statistics.pstdev(w) / statistics.fmean(w) for w in windows) >= floor - 1e-9


def _booked_lane(store, time_: FakeTime):
    """A fetcher (exact sampler) on a 2/s source whose slots at +0, +0.5 and +1 s other batches booked."""
    exact = GapSampler(random.Random(1), sigma=0.0, pause_probability=0.0)
    fetcher, lanes, sent = make_fetcher(store, time_, [httpx.Response(200, json={"results": []})], sampler=exact)
    source = spec(rate_per_s=2.0)
    for _ in range(3):
        lanes.reserve([source_lane(source)], max_wait_s=60)
    return fetcher, lanes, sent, source


def test_background_work_stands_back_from_a_booked_lane_so_a_fresh_lead_goes_first(sqlite_store) -> None:
    time_ = FakeTime()
    start = time_.now_s
    fetcher, lanes, sent, source = _booked_lane(sqlite_store, time_)
    fresh: list[float] = []

    def a_fresh_lead_asks() -> None:  # while the batch's request stands back
        if not fresh:
            fresh.append(lanes.reserve([source_lane(source)], max_wait_s=60).wait_s)

    time_.on_sleep = a_fresh_lead_asks
    fetcher.fetch(source, REQUEST, lead_id="l1", background=True)
    assert fresh == [pytest.approx(1.5)]  # the next free slot: the batch had not booked it
    assert sent[0] - start >= 2.0  # the batch's request went after the fresh lead's


def test_an_interactive_fetch_books_the_next_slot_however_far_ahead(sqlite_store) -> None:
    time_ = FakeTime()
    start = time_.now_s
    fetcher, _, sent, source = _booked_lane(sqlite_store, time_)
    fetcher.fetch(source, REQUEST, lead_id="l1")
    assert time_.slept == [pytest.approx(1.5)] and sent[0] - start == pytest.approx(1.5)  # one wait, no standing back


def test_a_process_s_background_requests_ask_a_booked_lane_one_at_a_time(sqlite_store) -> None:
    asked = []

    class CountingLanes(RateLanes):
        def reserve(self, lanes, **options):
            reservation = super().reserve(lanes, **options)
            asked.append(threading.current_thread().name)
            return reservation

    source = spec(rate_per_s=20.0)
    lanes = CountingLanes(sqlite_store, sampler=GapSampler(random.Random(1), sigma=0.0, pause_probability=0.0))
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"results": []}))
    fetcher = Fetcher(sink=sqlite_store, lanes=lanes, transport=transport, rng=random.Random(3))
    with ThreadPoolExecutor(max_workers=4) as pool:  # a batch's threads keep the lane busy
        list(pool.map(lambda n: fetcher.fetch(source, REQUEST, lead_id=f"l{n}", background=True), range(24)))
    # One thread at a time asks, and again when the next slot comes near: about two questions per
    # request. Four threads each asking at every slot would ask about four times per request.
    assert len(asked) <= 2.5 * 24


@pytest.mark.parametrize(("background", "sleeps"), [(False, 2), (True, 1)])
def test_a_background_request_that_waited_behind_others_does_not_think(sqlite_store, background: bool,
                                                                        sleeps: int) -> None:
    time_ = FakeTime()
    # The exact sampler: a think lasts 0 s but is still a sleep, and nothing else sleeps.
    exact = GapSampler(random.Random(1), sigma=0.0, pause_probability=0.0)
    fetcher, lanes, _ = make_fetcher(sqlite_store, time_, [httpx.Response(200, json={"results": []})] * 3,
                                     sampler=exact)
    source = spec(rate_per_s=2.0)
    fetcher.fetch(source, REQUEST, lead_id="l1")
    for _ in range(3):  # three other identities take the source's next slots
        lanes.reserve([source_lane(source)], max_wait_s=60)
    fetcher.fetch(source, REQUEST, lead_id="l1")  # waits 3 intervals behind them
    before = len(time_.slept)
    fetcher.fetch(source, REQUEST, lead_id="l1", background=background)
    assert len(time_.slept) == before + sleeps  # a think (interactive only), then the lane wait


# -- a burst of refusals and the identity's health ---------------------------------------------


def pooled_session(store, time_: FakeTime, answers: list[httpx.Response]) -> tuple[
        IdentitySession, IdentityPool]:
    """A session leased from a pool of one identity, sent through a proxy (here a scripted transport)."""
    catalog = parse_identities("tiers: [datacenter]\nidentities:\n"
                               "  - {id: px, proxy_url: 'http://127.0.0.9:3128', range: r1, tier: datacenter}\n")
    pool = IdentityPool(store, catalog, clock=time_.clock, rng=random.Random(1))
    lease = pool.acquire("fragile", holder="test", ttl_s=3600.0)
    assert lease is not None
    replies = iter(answers)
    client = httpx.Client(transport=httpx.MockTransport(lambda request: next(replies)))
    return IdentitySession(identity_id="px", client=client, proxied=True, lease=lease, pool=pool), pool


REFUSED_THEN_OK = [httpx.Response(429)] * 4 + [httpx.Response(200, json={"results": []})]


def test_refusals_within_the_identity_s_cut_hold_count_against_it_once(sqlite_store) -> None:
    time_ = FakeTime()
    fetcher, _, _ = make_fetcher(sqlite_store, time_, [])
    session, pool = pooled_session(sqlite_store, time_, REFUSED_THEN_OK)
    # Four refusals in a few seconds, all within the hold of the first one's cut: one episode.
    result = fetcher.fetch(spec(cut_hold_s=60.0), REQUEST, lead_id="l1", session=session)
    assert result.status == 200
    health = pool.health("px", "fragile")
    assert health is not None and health.state == "healthy"
    assert health.score == pytest.approx(1.0 - pool.policy.success_weight)


def test_refusals_further_apart_than_the_cut_hold_each_count_and_rest_the_identity(sqlite_store) -> None:
    time_ = FakeTime()
    fetcher, _, _ = make_fetcher(sqlite_store, time_, [])
    session, pool = pooled_session(sqlite_store, time_, REFUSED_THEN_OK)
    with pytest.raises(IdentityBlocked):
        fetcher.fetch(spec(cut_hold_s=0.01), REQUEST, lead_id="l1", session=session)
    health = pool.health("px", "fragile")
    assert health is not None and health.state == "resting"
