"""Cost per source from the fetch log, and the daily budget that holds background work back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from investigations.collection.events import FetchEvent, Outcome
from investigations.intake.leads import normalize_lead
from investigations.scheduling.cost import (
    IdentityPrice,
    Usage,
    collection_cost_usd,
    day_start,
    identity_prices,
    over_budget,
    records_per_usd,
    spend_by_source,
    spend_today,
    usage_cost_usd,
)
from investigations.scheduling.dispatch import plan_dispatch, plan_recurring
from investigations.sources.specs import parse_sources
from investigations.store import StateStore
from investigations.store import schema as s

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CATALOG = parse_sources("""
sources:
  - name: paid
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://paid.example/api?q={value}"}
    rate: {source_per_s: 1, source_burst: 1, identity_per_s: 1, identity_burst: 1}
    recrawl_every: 1h
    daily_budget_usd: 1
    cost_per_request_usd: 0.25
  - name: free
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://free.example/api?q={value}"}
    rate: {source_per_s: 1, source_burst: 1, identity_per_s: 1, identity_burst: 1}
    recrawl_every: 1h
""")


def fetched(store: StateStore, source: str, *, requests: int, at: datetime, identity_id: str = "direct",
            size: int = 0, lead_id: str = "l", run_id: str | None = None) -> None:
    store.record_fetches(
        FetchEvent(source=source, lead_id=lead_id, identity_id=identity_id, url="https://x.example/", method="GET",
                   status=200, outcome=Outcome.OK, latency_ms=10.0, bytes=size, attempt=1, at=at, run_id=run_id)
        for _ in range(requests)
    )


def register_identity(store: StateStore, identity_id: str, *, per_request: float, per_mb: float,
                      active: bool = True) -> None:
    with store.engine.begin() as conn:
        conn.execute(s.identities.insert().values(
            identity_id=identity_id, range="r", tier="datacenter", tier_rank=0, cost_per_request_usd=per_request,
            cost_per_mb_usd=per_mb, proxy=None, active=active, synced_at_s=0.0))


@pytest.mark.parametrize(
    ("requests", "size", "source_usd", "identity", "expected"),
    [
        (0, 0, 0.25, IdentityPrice(0.01, 1.0), 0.0),
        (4, 0, 0.25, IdentityPrice(), 1.0),  # the direct identity: only the source's price
        (4, 0, 0.0, IdentityPrice(0.01, 0.0), 0.04),  # a free source through a paid proxy
        (1, 2_500_000, 0.0, IdentityPrice(0.0, 0.4), 1.0),  # 2.5 decimal MB at 0.40 USD/MB
        (2, 500_000, 0.1, IdentityPrice(0.05, 2.0), 2 * 0.15 + 1.0),
    ],
)
def test_the_price_of_requests(requests, size, source_usd, identity, expected) -> None:
    usage = Usage("paid", "id", requests, size)
    assert usage_cost_usd(usage, source_cost_per_request_usd=source_usd, identity=identity) == pytest.approx(expected)


def test_spend_by_source_prices_each_identity_and_leaves_out_sources_no_longer_configured() -> None:
    usage = [Usage("paid", "direct", 2, 0), Usage("paid", "dc1", 1, 1_000_000), Usage("free", "dc1", 10, 0),
             Usage("gone", "dc1", 100, 0)]
    spent = spend_by_source(usage, CATALOG, {"dc1": IdentityPrice(0.01, 0.5)})
    assert spent == pytest.approx({"paid": 2 * 0.25 + (0.25 + 0.01 + 0.5), "free": 0.1})


@pytest.mark.parametrize(
    ("budget", "spent", "held"),
    [
        (0.0, 1_000.0, False),  # no budget
        (1.0, 0.0, False),
        (1.0, 0.99, False),
        (1.0, 1.0, True),  # reached is spent
        (1.0, 3.5, True),
    ],
)
def test_the_budget_rule(budget, spent, held) -> None:
    spec = CATALOG.get("paid").model_copy(update={"daily_budget_usd": budget})
    reason = over_budget(spec, spent)
    assert (reason is not None) == held
    if held:
        assert reason == f"budget: spent {spent:.2f} of {budget:.2f} USD today"


def test_records_per_usd_has_no_figure_when_nothing_was_spent() -> None:
    assert records_per_usd(50, 2.0) == 25.0
    assert records_per_usd(50, 0.0) is None


def test_the_budget_day_starts_at_midnight_utc() -> None:
    assert day_start(datetime(2026, 12, 2, 0, 30, tzinfo=UTC)) == datetime(2026, 12, 2, tzinfo=UTC)
    late = datetime(2026, 12, 2, 23, 30, tzinfo=UTC).astimezone(tz=None)
    assert day_start(late) == datetime(2026, 12, 2, tzinfo=UTC)


def test_spend_today_counts_today_s_requests_at_their_identity_s_price(store: StateStore) -> None:
    register_identity(store, "dc1", per_request=0.01, per_mb=0.0)
    register_identity(store, "old", per_request=0.1, per_mb=0.0, active=False)  # dropped from the file
    fetched(store, "paid", requests=3, at=NOW - timedelta(hours=1))
    fetched(store, "paid", requests=2, at=NOW - timedelta(hours=2), identity_id="dc1")
    fetched(store, "free", requests=1, at=NOW - timedelta(hours=3), identity_id="old")
    fetched(store, "paid", requests=40, at=day_start(NOW) - timedelta(seconds=1))  # yesterday
    assert spend_today(store, CATALOG, now=NOW) == pytest.approx({"paid": 5 * 0.25 + 2 * 0.01, "free": 0.1})


def test_a_collection_costs_what_it_sent_at_each_identity_s_price(store: StateStore) -> None:
    register_identity(store, "dc1", per_request=0.01, per_mb=0.5)
    sent = {"dc1": (2, 3_000_000), "direct": (1, 500)}  # the direct identity costs nothing of its own
    cost = collection_cost_usd(CATALOG.get("paid"), sent, identity_prices(store))
    assert cost == pytest.approx(3 * 0.25 + 2 * 0.01 + 3 * 0.5)


def test_a_collection_that_sent_nothing_costs_nothing() -> None:
    assert collection_cost_usd(CATALOG.get("paid"), {}, {}) == 0.0


def queue(store: StateStore, source: str, priority_class: str, *values: str) -> list[str]:
    leads = [normalize_lead("domain", value) for value in values]
    for lead in leads:
        store.add_lead(lead, case_id="case", now=NOW - timedelta(days=1))
    store.enqueue([(source, lead.id) for lead in leads], origin=f"{priority_class}:1", priority_class=priority_class,
                  now=NOW)
    return [lead.id for lead in leads]


@pytest.mark.parametrize(
    ("paid_requests_today", "background_goes"),
    [(0, True), (3, True), (4, False), (10, False)],  # 0.25 USD a request against a 1 USD budget
)
def test_a_source_over_its_budget_gets_no_background_work_but_interactive_leads_still_go(
        store, paid_requests_today, background_goes) -> None:
    fetched(store, "paid", requests=paid_requests_today, at=NOW - timedelta(minutes=5))
    fetched(store, "free", requests=100, at=NOW - timedelta(minutes=5))  # free: no budget, no cost
    interactive = queue(store, "paid", "interactive", "fresh.example")
    recurring = queue(store, "paid", "recurring", "a.example", "b.example")
    free = queue(store, "free", "backfill", "c.example")
    plan = plan_dispatch(store, CATALOG, max_runs=10, now=NOW)
    handed = {(h.source, lead) for h in plan.handovers for lead in h.lead_ids}
    assert ("paid", interactive[0]) in handed
    assert ("free", free[0]) in handed
    assert all((("paid", lead) in handed) == background_goes for lead in recurring)
    budget_reasons = [reason for reason in plan.reasons if "budget" in reason]
    if background_goes:
        assert budget_reasons == []
    else:
        assert budget_reasons == [f"paid: budget: spent {paid_requests_today * 0.25:.2f} of 1.00 USD today; "
                                  "2 background collections wait in the backlog"]


def test_an_interactive_only_pass_over_budget_hands_over_fresh_leads_without_a_budget_note(store) -> None:
    fetched(store, "paid", requests=8, at=NOW - timedelta(minutes=5))
    queue(store, "paid", "interactive", "fresh.example")
    queue(store, "paid", "recurring", "a.example")
    plan = plan_dispatch(store, CATALOG, max_runs=10, now=NOW, background=False)
    assert [h.priority_class.value for h in plan.handovers] == ["interactive"]
    assert not any("budget" in reason for reason in plan.reasons)


def test_recurring_crawls_of_a_source_over_budget_are_skipped_until_the_next_utc_day(store) -> None:
    (lead,) = queue(store, "paid", "interactive", "monitored.example")
    store.finish_dispatched("paid", lead, outcome="ok", now=NOW)
    store.complete_collection(source="paid", lead_id=lead, outcome="ok", records=1, content_hash="h", path="/p",
                                     run_id="r", now=NOW - timedelta(hours=3))
    with store.engine.begin() as conn:  # the interactive row is done
        conn.execute(s.collection_queue.update().values(state="done"))
    fetched(store, "paid", requests=4, at=NOW - timedelta(hours=1))
    plans = {p.source: p for p in plan_recurring(store, CATALOG, now=NOW)}
    assert plans["paid"].skipped == "budget: spent 1.00 of 1.00 USD today" and plans["paid"].queued == 0
    tomorrow = day_start(NOW) + timedelta(days=1, minutes=1)
    plans = {p.source: p for p in plan_recurring(store, CATALOG, now=tomorrow)}
    assert plans["paid"].skipped is None and plans["paid"].queued == 1


def test_the_spend_meter_reads_only_what_came_after_the_settled_part_of_the_day(store) -> None:
    from investigations.scheduling.cost import SETTLE_S, SpendMeter

    meter = SpendMeter()
    fetched(store, "paid", requests=3, at=NOW - timedelta(hours=1))
    fetched(store, "paid", requests=2, at=NOW - timedelta(seconds=SETTLE_S / 2))  # may still change
    (usage,) = meter.usage_today(store, CATALOG.names, now=NOW)
    assert usage.requests == 5
    with store.engine.begin() as conn:  # the settled hour is kept, not read again
        conn.execute(s.fetch_log.delete().where(s.fetch_log.c.at < NOW - timedelta(seconds=SETTLE_S)))
    fetched(store, "paid", requests=4, at=NOW + timedelta(seconds=5))
    (usage,) = meter.usage_today(store, CATALOG.names, now=NOW + timedelta(seconds=10))
    assert usage.requests == 3 + 2 + 4
    # The next UTC day starts from nothing; so does a meter asked about other sources.
    assert meter.usage_today(store, CATALOG.names, now=day_start(NOW) + timedelta(days=1)) == []
    assert meter.usage_today(store, ["free"], now=NOW + timedelta(seconds=10)) == []


def test_a_negative_price_fails_at_load_naming_the_source_and_key() -> None:
    from investigations.sources.specs import SpecError

    text = """
sources:
  - name: paid
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://paid.example/api?q={value}"}
    cost_per_request_usd: -0.1
"""
    with pytest.raises(SpecError, match=r"source 'paid': key 'cost_per_request_usd': .*greater than or equal to 0"):
        parse_sources(text)
