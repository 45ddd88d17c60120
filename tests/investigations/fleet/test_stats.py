"""Fleet figures per source from plain rows, the health verdict, and the same read from a store."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event

from investigations.collection.events import FetchEvent, Outcome
from investigations.fleet import stats
from investigations.fleet.degradation import judge_source, lead_intervals_s
from investigations.fleet.stats import (
    Cadence,
    CollectionRow,
    Freshness,
    LaneStanding,
    RequestRow,
    figures_for,
    fleet_figures,
    health_of,
    identity_counts,
    identity_standings,
    lane_standings,
    percentile,
    read_identity_standings,
)
from investigations.intake.leads import normalize_lead
from investigations.pacing import GapSampler, RateLanes
from investigations.pacing.lanes import identity_lane, source_lane
from investigations.scheduling.cadence import SourcePlan
from investigations.scheduling.dispatch import plan_cadence
from investigations.sources.specs import parse_sources
from investigations.store import StateStore
from investigations.store import schema as s

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
WINDOW_S = 600.0
CATALOG = parse_sources("""
sources:
  - name: api
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://api.example/lookup?q={value}"}
    recrawl_every: 1h
    daily_budget_usd: 2
    cost_per_request_usd: 0.01
  - name: quiet
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://quiet.example/lookup?q={value}"}
""")
API = CATALOG.get("api")


def requests(*outcomes: str, attempt: int = 1, latency_ms: float = 50.0) -> list[RequestRow]:
    return [RequestRow("api", outcome, attempt, latency_ms) for outcome in outcomes]


def collections(*outcomes: str, records: int = 3) -> list[CollectionRow]:
    return [CollectionRow("api", outcome, records if outcome == "ok" else 0) for outcome in outcomes]


def figures(**rows):
    return figures_for(API, now=NOW, window_s=WINDOW_S, **rows)


HEALTHY = figures(requests=requests(*["ok"] * 10), collections=collections(*["ok"] * 5))


@pytest.mark.parametrize(
    ("changes", "verdict"),
    [
        ({}, "ok"),
        ({"collections": collections(*["empty"] * 5)}, "empty"),  # answers 200 with nothing in them
        ({"collections": collections("ok", "empty")}, "empty"),  # half empty: not the leads
        ({"collections": collections(*["ok"] * 9, "empty")}, "ok"),  # one lead with nothing is a lead
        ({"collections": collections("failed", "failed")}, "ok"),  # failed collections are not empty ones
        ({"requests": requests(*["ok"] * 7, "blocked", "throttled", "blocked")}, "blocked"),
        ({"requests": requests("throttled", "throttled")}, "blocked"),  # too few for a rate, but all pushed back
        ({"requests": requests("ok", "blocked")}, "ok"),  # too few, not all
        ({"requests": requests(*["ok"] * 6, *["transient"] * 4)}, "failing"),
        ({"requests": requests(*["ok"] * 3, *["transient"] * 4, *["blocked"] * 3)}, "blocked"),  # worst first
        ({"circuit": "open"}, "failing"),
        ({"identities": {"resting": 2, "retired": 1}}, "blocked"),  # no identity left to send as
        ({"identities": {"resting": 2, "leased": 1}}, "ok"),
        ({"spend_today_usd": 2.0}, "over_budget"),
        ({"requests": [], "collections": [], "depth": {"ready": 5}}, "stalled"),
        ({"freshness": Freshness(monitored=4, fresh=1, stalest_since=NOW - timedelta(hours=2))}, "stale"),
        ({"freshness": Freshness(monitored=4, fresh=2, stalest_since=NOW - timedelta(hours=2))}, "ok"),
        ({"requests": [], "collections": []}, "idle"),
        # Nothing collected in the window, but what the monitored leads hold is empty: not idle, empty.
        ({"requests": [], "collections": [],
          "freshness": Freshness(monitored=2, empty=2, stalest_since=NOW - timedelta(days=1))}, "empty"),
    ],
)
def test_the_health_verdict(changes, verdict) -> None:
    rows = {"requests": requests(*["ok"] * 10), "collections": collections(*["ok"] * 5), **changes}
    assert figures(**rows).health == verdict


def test_an_unhealthy_verdict_says_why() -> None:
    quiet = figures(requests=requests(*["ok"] * 4), collections=collections("ok", "empty", "empty"))
    assert (quiet.health, quiet.health_reason) == ("empty", "2 of 3 collections found no records")
    assert health_of(replace(HEALTHY, circuit="half_open")) == ("failing", "circuit half_open")


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([], 0.5, None), ([7.0], 0.95, 7.0), ([1, 2, 3, 4], 0.5, 2), (list(range(1, 101)), 0.95, 95),
     ([5, 1, 3], 0.5, 3)],
)
def test_percentile_is_nearest_rank(values, q, expected) -> None:
    assert percentile(values, q) == expected


def test_rates_latency_and_throughput_over_the_window() -> None:
    rows = (requests("ok", "ok", "ok", "ok", latency_ms=10.0) + requests("ok", "transient", attempt=2, latency_ms=100.0)
            + requests("throttled", "blocked", attempt=3, latency_ms=1000.0))
    f = figures(requests=rows, collections=collections("ok", "ok", "empty", "failed", records=30),
                spend_window_usd=0.5, depth={"ready": 2, "waiting": 3, "dispatched": 4})
    assert (f.requests, f.requests_per_min) == (8, 8 / 10)
    assert (f.retry_rate, f.failure_rate, f.block_rate) == (4 / 8, 1 / 8, 2 / 8)
    assert (f.latency_p50_ms, f.latency_p95_ms) == (10.0, 1000.0)
    assert (f.collections, f.collections_failed, f.records, f.records_per_min) == (4, 1, 60, 6.0)
    assert f.empty_rate == 1 / 3
    assert f.records_per_usd == 120.0
    assert (f.backlog, f.ready, f.in_flight) == (5, 2, 4)


def test_no_requests_means_no_rates_rather_than_zero_rates() -> None:
    f = figures()
    assert f.retry_rate is f.failure_rate is f.block_rate is f.empty_rate is f.latency_p50_ms is None
    assert f.records_per_usd is None and f.fresh_share is None and f.stalest_age_s is None


def test_freshness_counts_only_collections_with_records_within_the_cadence(store: StateStore) -> None:

    def lead(value, *, joined_ago, case="open", collections=()):
        item = normalize_lead("domain", value)
        store.add_lead(item, case_id=case, now=NOW - joined_ago)
        for outcome, records, ago in collections:
            store.complete_collection(source="api", lead_id=item.id, outcome=outcome, records=records, content_hash="h",
                                      path="/p", run_id="r", now=NOW - ago)

    day = timedelta(days=1)
    lead("fresh.example", joined_ago=day, collections=[("ok", 4, timedelta(minutes=10))])
    # Answered with records, then empty: the empty answer is the last success, and it is not fresh.
    lead("emptied.example", joined_ago=2 * day, collections=[("ok", 4, timedelta(hours=5)),
                                                             ("empty", 0, timedelta(minutes=10))])
    lead("old.example", joined_ago=day, collections=[("ok", 4, timedelta(hours=3))])  # past its 1 h cadence
    lead("failing.example", joined_ago=timedelta(hours=30), collections=[("failed", 0, timedelta(minutes=1))])
    lead("closed.example", joined_ago=5 * day, case="closed", collections=[("ok", 4, 4 * day)])
    store.set_case_status("closed", "closed")  # not monitored any more
    (api, _quiet) = fleet_figures(store, CATALOG, now=NOW, window_s=WINDOW_S)
    assert (api.monitored, api.fresh, api.fresh_share, api.monitored_empty) == (4, 1, 0.25, 1)
    # The stalest: the emptied lead, whose age runs from when it joined (2 days), not from its empty answer.
    assert api.stalest_age_s == (2 * day).total_seconds()


def test_the_recurring_share_counts_the_window_s_finished_collections_by_class(store: StateStore) -> None:
    for n, klass in enumerate(("recurring", "recurring", "recurring", "interactive")):
        store.enqueue([("api", f"lead-{n}")], origin=f"t{n}", priority_class=klass, now=NOW - timedelta(minutes=5))
    store.dispatch("api", limit=10, now=NOW - timedelta(minutes=4))
    for n in range(4):
        store.finish_dispatched("api", f"lead-{n}", outcome="ok", now=NOW - timedelta(minutes=3))
    api, quiet = fleet_figures(store, CATALOG, now=NOW, window_s=WINDOW_S)
    assert (api.recurring_share, quiet.recurring_share) == (0.75, None)


# -- cadence: how often each source collects its monitored leads again ------------------------------

CADENCED = parse_sources("""
sources:
  - name: learned
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://learned.example/lookup?q={value}"}
    recrawl: {min: 1h, max: 30d, every: 6h}
  - name: fixed
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://fixed.example/lookup?q={value}"}
    recrawl_every: 6h
  - name: starved
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://starved.example/lookup?q={value}"}
    recrawl: {min: 1h, max: 1d, every: 6h}
    daily_budget_usd: 0.01
    cost_per_request_usd: 0.01
""")
LEARNED, FIXED, STARVED = (CADENCED.get(name) for name in ("learned", "fixed", "starved"))
BUSY, CALM, DEAD = (normalize_lead("domain", f"{name}.example") for name in ("busy", "calm", "dead"))
DAY_S = 86_400.0


def monitored(store: StateStore, source: str = "learned") -> None:
    """Three leads of an open case visited every 6 h for two days until 12 h ago: busy changed each
    time, calm and dead never; dead is a dead letter since (the recurring plan leaves it out)."""
    prior_s = CADENCED.get(source).recrawl.prior_s
    for lead in (BUSY, CALM, DEAD):
        store.add_lead(lead, case_id="case", now=NOW - timedelta(days=3))
    for hour in range(0, 48, 6):
        at = NOW - timedelta(hours=54 - hour)
        for lead, content in ((BUSY, f"b{hour}"), (CALM, "same"), (DEAD, "same")):
            store.complete_collection(source=source, lead_id=lead.id, outcome="ok", records=2, content_hash=content,
                                      path="/p", run_id="r", now=at, change_prior_s=prior_s)
    store.put_dead_letter(source=source, lead_id=DEAD.id, reason_group="transient", last_status=503, attempts=4,
                          last_error="HTTP 503", now=NOW - timedelta(hours=1))


def by_source(store: StateStore, catalog=CADENCED) -> dict[str, stats.SourceFigures]:
    return {f.source: f for f in fleet_figures(store, catalog, now=NOW, window_s=WINDOW_S)}


def test_a_fixed_source_s_cadence_is_its_recrawl_every_and_its_freshness_the_sql_aggregate(store) -> None:
    monitored(store, "fixed")
    fixed = by_source(store)["fixed"]
    assert fixed.cadence == Cadence("fixed", 6 * 3600.0, 6 * 3600.0, 6 * 3600.0)
    assert (fixed.monitored, fixed.fresh) == (3, 0)  # all three collected 12 h ago: past 6 h
    assert fixed.as_dict()["cadence"] == {"kind": "fixed", "interval_s": 21600.0, "min_s": 21600.0,
                                          "max_s": 21600.0, "budget_short": False, "planned_at": None}


@pytest.mark.parametrize("stored", [False, True], ids=["not planned yet: planned now", "the planner's stored plan"])
def test_on_a_learned_cadence_a_lead_is_fresh_as_the_fresh_check_judges_it(store, stored) -> None:
    monitored(store)
    if stored:
        plan_cadence(store, LEARNED, now=NOW)  # what the recurring planner keeps each pass
    learned = by_source(store)["learned"]
    # All three were collected with records 12 h ago, far within recrawl.max (30 d): busy's own interval
    # (under 4 h, so stale after under 6 h) is long past, calm's (over 16 h) is not, and dead, which the
    # plan leaves out, is held to recrawl.max.
    assert (learned.monitored, learned.fresh, learned.fresh_share) == (3, 2, 2 / 3)
    verdict = judge_source(store, LEARNED, now=NOW)["fresh"]
    assert (verdict.details["monitored_leads"], verdict.details["stale_leads"], verdict.examples) == (3, 1, [BUSY.id])


@pytest.mark.parametrize("stored", [False, True], ids=["not planned yet: planned now", "the planner's stored plan"])
def test_a_learned_source_s_cadence_is_its_monitored_leads_median_planned_interval(store, stored) -> None:
    monitored(store)
    intervals = lead_intervals_s(store, LEARNED, now=NOW)
    assert intervals is not None and DEAD.id not in intervals
    if stored:
        plan_cadence(store, LEARNED, now=NOW - timedelta(minutes=1))
    cadence = by_source(store)["learned"].cadence
    assert cadence is not None and (cadence.kind, cadence.budget_short) == ("learned", False)
    assert cadence.interval_s == pytest.approx(statistics.median([intervals[BUSY.id], intervals[CALM.id]]))
    assert cadence.planned_at == (NOW - timedelta(minutes=1) if stored else None)
    assert (cadence.min_s, cadence.max_s) == (3600.0, 30 * DAY_S)


def test_a_stored_plan_is_read_not_made_again(store, monkeypatch) -> None:
    monitored(store)
    # A plan whose budget was short: every lead at its max, where planning now would give busy under 4 h.
    store.keep_cadence_plan("learned", SourcePlan(math.inf, short=True), now=NOW - timedelta(minutes=1))

    def planned_again(*_args, **_kwargs):
        raise AssertionError("planned again although a plan is stored")

    monkeypatch.setattr(stats, "lead_intervals_s", planned_again)
    learned = by_source(store)["learned"]
    assert learned.cadence == Cadence("learned", 30 * DAY_S, 3600.0, 30 * DAY_S, budget_short=True,
                                      planned_at=NOW - timedelta(minutes=1))
    assert learned.fresh == 3  # at its max (30 d), busy collected 12 h ago is fresh


def test_a_learned_source_whose_budget_is_short_has_every_lead_at_its_max(store) -> None:
    monitored(store, "starved")  # one request a day for two leads: short, stored plan or not
    starved = by_source(store)["starved"]
    assert starved.cadence is not None and (starved.cadence.interval_s, starved.cadence.budget_short) == (DAY_S, True)
    plan_cadence(store, STARVED, now=NOW)
    assert by_source(store)["starved"].cadence == replace(starved.cadence, planned_at=NOW)


def test_a_learned_source_without_monitored_leads_has_no_interval(store) -> None:
    assert by_source(store)["learned"].cadence == Cadence("learned", None, 3600.0, 30 * DAY_S)


def test_the_cadence_costs_a_learned_source_one_query_and_a_fixed_one_none(sqlite_store) -> None:
    store = sqlite_store
    monitored(store)
    monitored(store, "fixed")
    plan_cadence(store, LEARNED, now=NOW)
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    def queries(catalog) -> int:
        statements.clear()
        event.listen(store.engine, "before_cursor_execute", count)
        try:
            fleet_figures(store, catalog, now=NOW, window_s=WINDOW_S)
        finally:
            event.remove(store.engine, "before_cursor_execute", count)
        return len(statements)

    fixed, learned = (parse_sources(f"sources:\n  - {{name: {spec.name}, adapter: json_api, lead_kinds: [domain], "
                                    f"request: {{url: 'https://x.example/{{value}}'}}, {recrawl}}}\n")
                      for spec, recrawl in ((FIXED, "recrawl_every: 6h"),
                                            (LEARNED, "recrawl: {min: 1h, max: 30d, every: 6h}")))
    # Both have their monitored leads summed up in SQL; the learned one reads its leads and plan in one more.
    assert queries(learned) - queries(fixed) == 1


NOW_S = NOW.timestamp()
IDENTITIES = [{"identity_id": i, "tier": "datacenter", "range": r, "active": True}
              for i, r in (("a", "dc1"), ("b", "dc1"), ("c", "dc2"), ("d", "dc2"), ("e", "dc3"))]


def slot(identity, *, released=False, expires_in_s=60.0, holder="run-1", source="api"):
    return {"identity_id": identity, "source": source, "holder": holder, "released": released,
            "expires_at_s": NOW_S + expires_in_s}


def health(identity, state, *, rest_in_s=None, score=0.0, rests=0, source="api"):
    return {"identity_id": identity, "source": source, "state": state, "score": score, "rests": rests,
            "rest_until_s": None if rest_in_s is None else NOW_S + rest_in_s}


def test_identity_standings_worst_state_first() -> None:
    standings = identity_standings(
        identities=[*IDENTITIES, {"identity_id": "gone", "tier": "datacenter", "range": "dc9", "active": False}],
        leases=[slot("a"), slot("b", expires_in_s=-1.0), slot("c", released=True), slot("d"),
                slot("e", source="quiet")],
        health=[health("b", "resting", rest_in_s=120.0, score=3.0, rests=1), health("c", "resting", rest_in_s=-5.0),
                health("d", "retired", rests=4)],
        range_rests=[{"range": "dc3", "source": "quiet", "rest_until_s": NOW_S + 30}],
        failures={("b", "api"): 4},
        now_s=NOW_S,
    )
    by = {(row.identity_id, row.source): row for row in standings}
    assert by[("a", "api")].state == "leased" and by[("a", "api")].leased_by == "run-1"
    assert (by[("b", "api")].state, by[("b", "api")].rest_until_s, by[("b", "api")].failures) == (
        "resting", NOW_S + 120.0, 4)
    assert by[("b", "api")].leased_by is None  # its lease ran out
    assert by[("c", "api")].state == "available"  # its rest is over
    assert by[("d", "api")].state == "retired"  # even while leased
    assert (by[("e", "quiet")].state, by[("e", "quiet")].rest_until_s) == ("resting", NOW_S + 30)  # its range rests
    assert "gone" not in {row.identity_id for row in standings}
    counts = identity_counts(standings, ["api", "quiet"], pool_size=5)
    assert counts["api"] == {"available": 2, "leased": 1, "resting": 1, "retired": 1}  # e never went to api
    assert counts["quiet"] == {"available": 4, "leased": 0, "resting": 1, "retired": 0}


def test_an_identity_never_leased_is_listed_once_as_available() -> None:
    (row,) = identity_standings(identities=IDENTITIES[:1], leases=[], health=[], range_rests=[], now_s=NOW_S)
    assert (row.identity_id, row.source, row.state) == ("a", None, "available")


def fetch(store, source, outcome, *, at, status=200, attempt=1, identity_id="direct", latency_ms=20.0):
    store.record_fetch(FetchEvent(source=source, lead_id="l", identity_id=identity_id, url="https://x.example/",
                                  method="GET", status=status, outcome=outcome, latency_ms=latency_ms, bytes=1000,
                                  attempt=attempt, at=at))


def test_fleet_figures_read_from_the_store(store: StateStore) -> None:
    for minutes in (1, 2, 3):
        fetch(store, "api", Outcome.OK, at=NOW - timedelta(minutes=minutes), identity_id="a")
    fetch(store, "api", Outcome.THROTTLED, status=429, attempt=2, at=NOW - timedelta(minutes=4), identity_id="a")
    fetch(store, "api", Outcome.OK, at=NOW - timedelta(hours=2), identity_id="a")  # before the window: today only
    fetch(store, "quiet", Outcome.OK, at=NOW - timedelta(minutes=1))
    lead, other = normalize_lead("domain", "a.example"), normalize_lead("domain", "b.example")
    for item in (lead, other):
        store.add_lead(item, case_id="case", now=NOW - timedelta(days=1))
    store.complete_collection(source="api", lead_id=lead.id, outcome="ok", records=7, content_hash="h", path="/p",
                              run_id="r", now=NOW - timedelta(minutes=2))
    store.complete_collection(source="quiet", lead_id=lead.id, outcome="empty", records=0, content_hash="h",
                              path="/p", run_id="r", now=NOW - timedelta(minutes=1))
    store.enqueue([("api", other.id)], origin="t", priority_class="recurring", now=NOW)
    store.put_dead_letter(source="quiet", lead_id=other.id, reason_group="transient", last_status=503, attempts=4,
                          last_error="HTTP 503", now=NOW)
    with store.engine.begin() as conn:
        conn.execute(s.identities.insert(), [
            {"identity_id": i, "range": "dc1", "tier": "datacenter", "tier_rank": 0, "cost_per_request_usd": 0.001,
             "cost_per_mb_usd": 0.0, "proxy": None, "active": True, "synced_at_s": 0.0} for i in ("a", "b")])
        conn.execute(s.identity_leases.insert().values(
            source="api", identity_id="a", lease_id="x", holder="run-9", fencing_token=1, acquired_at_s=NOW_S,
            expires_at_s=NOW_S + 60, released=False))

    api, quiet = fleet_figures(store, CATALOG, now=NOW, window_s=WINDOW_S, circuits={"quiet": "open"})
    assert (api.requests, api.retry_rate, api.block_rate, api.records, api.backlog) == (4, 0.25, 0.25, 7, 1)
    assert (api.monitored, api.fresh, api.identities_leased, api.identities_available) == (1, 1, 1, 1)
    assert api.spend_today_usd == pytest.approx(5 * 0.011)
    assert api.spend_window_usd == pytest.approx(4 * 0.011)
    assert api.health == "ok"  # 1 of 4 throttled: too few requests to call it a rate
    assert (quiet.empty_rate, quiet.dead_letters, quiet.circuit, quiet.health) == (1.0, 1, "open", "failing")
    assert quiet.identities_available == 2
    leased = [row for row in read_identity_standings(store, now=NOW) if row.state == "leased"]
    assert [(row.identity_id, row.source, row.leased_by) for row in leased] == [("a", "api", "run-9")]


def test_captures_kept_for_a_source_count_in_its_cost(store: StateStore, tmp_path) -> None:
    priced = parse_sources("""
sources:
  - name: api
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://api.example/lookup?q={value}"}
    evidence_usd_per_gb: 0.02
""")
    day = tmp_path / "evidence" / "api" / "2026-12-02"
    day.mkdir(parents=True)
    (day / "lead-1.warc.gz").write_bytes(b"x" * 2_000_000)
    (day / "lead-2.warc.gz.tmp").write_bytes(b"x" * 5)  # not yet a capture
    (figures,) = fleet_figures(store, priced, now=NOW, data_dir=tmp_path)
    assert figures.evidence_bytes == 2_000_000
    assert figures.evidence_usd == pytest.approx(2_000_000 / 1e9 * 0.02)


# -- pacing: what each rate lane learned ----------------------------------------------------------

PACED = parse_sources("""
sources:
  - name: api
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://api.example/lookup?q={value}"}
    rate: {source_per_s: 8, identity_per_s: 2}
  - name: quiet
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://quiet.example/lookup?q={value}"}
    rate: {source_per_s: 3}
""")
# A source the fleet once had: its lanes stay in the store after it left the sources file.
GONE = parse_sources("""
sources:
  - name: gone
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://gone.example/lookup?q={value}"}
""").get("gone")
PACED_API, PACED_QUIET = PACED.get("api"), PACED.get("quiet")
T0 = 1_800_000_000.0
LANES_NOW_S = T0 + 100
API_LANE, QUIET_LANE = source_lane(PACED_API), source_lane(PACED_QUIET)
IDENTITY_A, IDENTITY_B = identity_lane(PACED_API, "a"), identity_lane(PACED_API, "b")
THROTTLED, OK = Outcome.THROTTLED, Outcome.OK


def told(at_s, lanes, outcome, *, retry_after_s=None, pooled=False):
    """One answer's feedback to `lanes` at `at_s`, as the fetcher gives it."""
    return at_s, lanes, outcome, retry_after_s, pooled


@pytest.mark.parametrize(("answers", "expected"), [
    pytest.param([], [], id="nothing sent: no lane, nothing shown"),
    pytest.param([told(T0, [API_LANE], THROTTLED)],
                 [LaneStanding("api", None, 8, 4, ceiling_per_s=8, ceiling_age_s=100)],
                 id="a throttle halves the rate in use; the ceiling is the rate throttled, 100 s ago"),
    pytest.param([told(T0, [API_LANE, IDENTITY_A], OK)],
                 [LaneStanding("api", None, 8, 8), LaneStanding("api", "a", 2, 2)],
                 id="never throttled: in use at the configured rate, no ceiling"),
    pytest.param([told(T0, [API_LANE], THROTTLED), told(T0 + 50, [API_LANE], THROTTLED)],
                 [LaneStanding("api", None, 8, 2, ceiling_per_s=4, ceiling_age_s=50)],
                 id="a second cut: the ceiling is the rate throttled then, its age from then"),
    pytest.param([told(T0 + 40, [API_LANE, IDENTITY_A], THROTTLED, pooled=True)],
                 [LaneStanding("api", "a", 2, 1, ceiling_per_s=2, ceiling_age_s=60)],
                 id="one identity throttled: its own lane is cut, at the identity rate"),
    pytest.param([told(T0 + 90, [API_LANE], THROTTLED, retry_after_s=30)],
                 [LaneStanding("api", None, 8, 4, ceiling_per_s=8, ceiling_age_s=10, floor_until_s=T0 + 120)],
                 id="a Retry-After still ahead holds the lane until then"),
    pytest.param([told(T0, [API_LANE], THROTTLED, retry_after_s=30)],
                 [LaneStanding("api", None, 8, 4, ceiling_per_s=8, ceiling_age_s=100)],
                 id="a Retry-After past holds nothing"),
    pytest.param([told(T0, [QUIET_LANE], OK), told(T0, [IDENTITY_B], OK), told(T0, [API_LANE, IDENTITY_A], OK)],
                 [LaneStanding("api", None, 8, 8), LaneStanding("api", "a", 2, 2), LaneStanding("api", "b", 2, 2),
                  LaneStanding("quiet", None, 3, 3)],
                 id="catalog order, each source's lane before its identities' by id"),
    pytest.param([told(T0, [source_lane(GONE), identity_lane(GONE, "a")], THROTTLED)], [],
                 id="a source gone from the catalog: its lanes are left out"),
])
def test_lane_standings_show_the_configured_rate_the_rate_in_use_and_the_learned_ceiling(
        store: StateStore, answers, expected) -> None:
    for at_s, lanes, outcome, retry_after_s, pooled in answers:
        RateLanes(store, sampler=GapSampler(random.Random(1)), clock=lambda at_s=at_s: at_s).feedback(
            lanes, outcome=outcome, retry_after_s=retry_after_s, throttle=PACED_API.throttle, pooled_identity=pooled)
    assert lane_standings(store, PACED, LANES_NOW_S) == expected
