"""Identities on the wire: each leased identity goes out through its own proxy (a distinct client
address at the sandbox), with its own fingerprint and its own cookie jar, and the pool hears what
every answer says about it. Real loopback proxies on 127.0.0.2 and 127.0.0.3, the real sandbox."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from investigations.collection.collect import CollectionFailed, CollectionParked, Collector
from investigations.collection.fetcher import Fetcher
from investigations.evidence.records import RecordStore
from investigations.identities import CookieStore, IdentityCatalog, IdentityPool, parse_identities
from investigations.intake.leads import normalize_lead
from investigations.pacing import GapSampler, RateLanes
from investigations.sandbox.proxy import ProxyGroup, start_proxies
from investigations.sources.specs import SourceCatalog, parse_sources
from investigations.store import StateStore
from tests.fakes import FakeTime

PROXY_HOSTS = ("127.0.0.2", "127.0.0.3")

IDENTITIES = """
tiers: [datacenter]
fingerprints:
  chrome_win:
    user_agent: "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/124.0.0.0 Safari/537.36"
    accept_language: "en-US,en;q=0.9"
    headers:
      - [User-Agent, ""]
      - [Accept, "text/html,application/xhtml+xml,*/*;q=0.8"]
      - [Accept-Encoding, "gzip, deflate"]
      - [Accept-Language, ""]
      - [Connection, "keep-alive"]
  firefox_mac:
    user_agent: "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.4; rv:125.0) Gecko/20100101 Firefox/125.0"
    accept_language: "en-GB,en;q=0.7"
    headers:
      - [User-Agent, ""]
      - [Accept, "text/html,*/*;q=0.8"]
      - [Accept-Language, ""]
      - [Accept-Encoding, "gzip, deflate"]
      - [Connection, "keep-alive"]
defaults: {{tier: datacenter}}
identities:
  - {{id: px_a, proxy_url: "{a}", range: r1, fingerprint: chrome_win}}
  - {{id: px_b, proxy_url: "{b}", range: r2, fingerprint: firefox_mac}}
"""

SOURCES = """
defaults:
  lead_kinds: [domain, username]
  rate: {{source_per_s: 100, source_burst: 10, identity_per_s: 100, identity_burst: 10}}
  retry: {{attempts: 2, base_delay_s: 0.01, max_delay_s: 0.02}}
  timeout_s: 5
sources:
  - name: robust
    adapter: json_api
    request: {{url: "{url}/robust/api/lookup?kind={{kind}}&q={{value}}"}}
    parse: {{records_path: results, record_key: id}}
  - name: banning
    adapter: html
    request: {{url: "{url}/banning/profile/{{kind}}/{{value}}"}}
    parse: {{records_selector: li.post, record_key: "@data-id", fields: {{title: a.title}}}}
  - name: flaky
    adapter: html
    request: {{url: "{url}/flaky/profile/{{kind}}/{{value}}"}}
    parse: {{records_selector: li.post, record_key: "@data-id", fields: {{title: a.title}}}}
"""


@pytest.fixture(scope="module")
def proxies() -> Iterator[ProxyGroup]:
    with start_proxies(PROXY_HOSTS) as group:
        yield group


def identities(proxies: ProxyGroup, count: int = 2) -> IdentityCatalog:
    catalog = parse_identities(IDENTITIES.format(a=proxies[0].url, b=proxies[1].url))
    return IdentityCatalog(tiers=catalog.tiers, identities=catalog.identities[:count])


@dataclass
class World:
    store: StateStore
    catalog: SourceCatalog
    pool: IdentityPool
    fetcher: Fetcher
    collector: Collector
    records: RecordStore

    def lead(self, value: str) -> str:
        lead = normalize_lead("domain", value)
        self.store.add_lead(lead, case_id="case-identities")
        return lead.id

    def fresh_fetcher(self) -> Collector:
        """A new fetcher and collector over the same store and pool (a later run)."""
        self.fetcher.close()
        self.fetcher = _fetcher(self.store, self.pool)
        self.collector = Collector(catalog=self.catalog, store=self.store, records=self.records, fetcher=self.fetcher)
        return self.collector


def _fetcher(store: StateStore, pool: IdentityPool) -> Fetcher:
    lanes = RateLanes(store, sampler=GapSampler(random.Random(3), sigma=0.0, pause_probability=0.0))
    return Fetcher(sink=store, lanes=lanes, pool=pool, cookies=CookieStore(store), sleep=lambda s: None)


def _world(sandbox, proxies: ProxyGroup, store: StateStore, tmp_path: Path, count: int) -> World:
    sandbox.app_state.reset()
    catalog = parse_sources(SOURCES.format(url=sandbox.url))
    pool = IdentityPool(store, identities(proxies, count), rng=random.Random(1))
    fetcher = _fetcher(store, pool)
    records = RecordStore(tmp_path / "records")
    collector = Collector(catalog=catalog, store=store, records=records, fetcher=fetcher)
    return World(store, catalog, pool, fetcher, collector, records)


@pytest.fixture
def world(sandbox, proxies: ProxyGroup, sqlite_store: StateStore, tmp_path: Path) -> Iterator[World]:
    made = _world(sandbox, proxies, sqlite_store, tmp_path, count=2)
    yield made
    made.fetcher.close()
    made.pool.close()


@pytest.fixture
def one_identity(sandbox, proxies: ProxyGroup, sqlite_store: StateStore, tmp_path: Path) -> Iterator[World]:
    made = _world(sandbox, proxies, sqlite_store, tmp_path, count=1)
    yield made
    made.fetcher.close()
    made.pool.close()


def test_each_identity_reaches_the_sandbox_from_its_own_proxy_address(world: World, sandbox) -> None:
    first = world.collector.collect("robust", world.lead("one.example"))
    second = world.collector.collect("robust", world.lead("two.example"))
    assert (first.identity_ids, second.identity_ids) == (["px_a"], ["px_b"])
    assert sandbox.app_state["robust"].clients == {"127.0.0.2": 1, "127.0.0.3": 1}
    assert [row["identity_id"] for row in world.store.fetch_log(source="robust")] == ["px_a", "px_b"]


def test_fingerprint_headers_arrive_in_order_with_the_identitys_user_agent(world: World, sandbox) -> None:
    world.collector.collect("robust", world.lead("one.example"))
    [seen] = sandbox.app_state["robust"].recent
    fingerprint = world.pool.catalog.get("px_a").fingerprint
    assert seen.header_names == ("host", *(name.lower() for name, _ in fingerprint.ordered_headers()))
    assert seen.user_agent == fingerprint.user_agent


def test_requests_pace_on_the_identitys_own_lane(world: World) -> None:
    world.collector.collect("robust", world.lead("one.example"))
    lanes = world.fetcher.lanes
    assert lanes is not None
    assert lanes.state("identity:robust:px_a") is not None
    assert lanes.state("identity:robust:direct") is None


def test_cookies_set_in_one_collection_are_sent_in_the_next_even_by_a_new_fetcher(
    one_identity: World, sandbox
) -> None:
    one_identity.collector.collect("banning", one_identity.lead("one.example"))
    assert sandbox.app_state["banning"].recent[-1].cookie_names == ()
    one_identity.fresh_fetcher().collect("banning", one_identity.lead("two.example"))
    assert sandbox.app_state["banning"].recent[-1].cookie_names == ("visitor",)
    assert sandbox.app_state["banning"].returning_visitors == 1


def test_a_block_page_moves_the_collection_on_to_another_identity(world: World, sandbox) -> None:
    sandbox.app_state["banning"].ban("127.0.0.2")
    result = world.collector.collect("banning", world.lead("one.example"))
    assert (result.outcome, result.identity_ids, len(result.lease_ids)) == ("ok", ["px_a", "px_b"], 2)
    statuses = [(row["identity_id"], row["status"]) for row in world.store.fetch_log(source="banning")]
    assert statuses == [("px_a", 403), ("px_b", 200)]


def test_a_block_page_rests_the_identity_at_that_source_only(world: World, sandbox) -> None:
    sandbox.app_state["banning"].ban("127.0.0.2")
    world.collector.collect("banning", world.lead("one.example"))
    health = world.pool.health("px_a", "banning")
    assert health is not None and health.state == "resting"
    assert world.pool.health("px_a", "robust") is None
    assert world.collector.collect("robust", world.lead("two.example")).identity_ids == ["px_a"]


def test_every_identity_blocked_parks_the_collection_instead_of_failing_it(world: World, sandbox) -> None:
    for host in PROXY_HOSTS:
        sandbox.app_state["banning"].ban(host)
    lead_id = world.lead("one.example")
    with pytest.raises(CollectionParked, match="no other available"):
        world.collector.collect("banning", lead_id)
    assert world.store.dead_letters() == []
    assert world.store.queue_depths()["banning"]["waiting"] == 1


def _collector(world: World, fake: FakeTime, wait_s: float = 5.0) -> Collector:
    return Collector(catalog=world.catalog, store=world.store, records=world.records, fetcher=world.fetcher,
                     lease_wait_s=wait_s, clock=fake.clock, sleep=fake.sleep)


def test_every_identity_leased_elsewhere_waits_then_parks_with_the_reason_and_no_request(world: World) -> None:
    held = [world.pool.acquire("robust", holder="another-run", ttl_s=60) for _ in PROXY_HOSTS]
    assert all(held)
    fake = FakeTime()
    lead_id = world.lead("one.example")
    world.store.enqueue([("robust", lead_id)], origin="backfill:1", priority_class="backfill")
    world.store.dispatch("robust", limit=1)
    with pytest.raises(CollectionParked, match="leased by other collections for 5 s"):
        _collector(world, fake).collect("robust", lead_id)
    assert fake.now >= 5.0 and world.store.fetch_log() == []
    assert world.store.park_reasons("robust") == {"all identities for robust leased by other collections for 5 s": 1}


def test_a_collection_waits_for_an_identity_another_collection_releases_instead_of_parking(world: World) -> None:
    held = [world.pool.acquire("robust", holder="another-run", ttl_s=60) for _ in PROXY_HOSTS]
    fake = FakeTime(lambda slept: world.pool.release(held[0]) if len(slept) == 3 else None)
    result = _collector(world, fake).collect("robust", world.lead("one.example"))
    assert result.outcome == "ok" and result.identity_ids == [held[0].identity_id] and len(fake.slept) == 3


def test_more_threads_than_identities_against_a_source_that_never_refuses_park_nothing(world: World) -> None:
    leads = [world.lead(f"lead{i}.example") for i in range(12)]
    world.store.enqueue([("robust", lead) for lead in leads], origin="backfill:1", priority_class="backfill")
    world.store.dispatch("robust", limit=12)
    with ThreadPoolExecutor(max_workers=6) as threads:  # 6 threads, 2 identities
        results = list(threads.map(lambda lead: world.collector.collect("robust", lead, background=True), leads))
    assert [r.outcome for r in results] == ["ok"] * 12
    assert world.store.park_reasons() == {}


def test_of_a_process_s_collections_waiting_for_an_identity_one_asks_the_pool_at_a_time(world: World) -> None:
    leads = [world.lead(f"lead{i}.example") for i in range(12)]
    waiting, most = [0], [0]
    lock = threading.Lock()
    wait_for_release = world.pool.wait_for_release

    def counted(timeout_s: float) -> None:
        with lock:
            waiting[0] += 1
            most[0] = max(most[0], waiting[0])
        try:
            wait_for_release(timeout_s)
        finally:
            with lock:
                waiting[0] -= 1

    world.pool.wait_for_release = counted  # type: ignore[method-assign]
    with ThreadPoolExecutor(max_workers=6) as threads:  # 6 threads, 2 identities: 4 wait at a time
        results = list(threads.map(lambda lead: world.collector.collect("robust", lead, background=True), leads))
    assert [r.outcome for r in results] == ["ok"] * 12
    assert most[0] == 1


def test_no_usable_identity_parks_at_once_with_the_reason(world: World, sandbox) -> None:
    for identity_id in ("px_a", "px_b"):
        lease = world.pool.acquire("robust", holder="flagging-run", ttl_s=60)
        assert lease is not None and lease.identity_id == identity_id
        world.pool.report(lease, "identity_fault", status=403)  # a hard block: straight to rest
        world.pool.release(lease)
    fake = FakeTime()
    with pytest.raises(CollectionParked, match="no identity available"):
        _collector(world, fake).collect("robust", world.lead("one.example"))
    assert fake.slept == []  # nothing to wait for: none is merely busy


def test_server_errors_do_not_hurt_the_identitys_health(world: World, sandbox) -> None:
    flaky = sandbox.app_state["flaky"]
    before = {"error_rate": flaky.settings.error_rate, "stall_rate": flaky.settings.stall_rate}
    sandbox.app_state.configure("flaky", {"error_rate": 1.0, "stall_rate": 0.0})
    try:
        with pytest.raises(CollectionFailed):
            world.collector.collect("flaky", world.lead("one.example"))
    finally:
        sandbox.app_state.configure("flaky", before)
    rows = world.store.fetch_log(source="flaky")
    assert [row["identity_id"] for row in rows] == ["px_a", "px_a"]
    assert all(500 <= row["status"] < 600 for row in rows)
    assert world.pool.health("px_a", "flaky") is None
    assert world.pool.active_leases() == []


def _lone_identity_world(sandbox, store: StateStore, tmp_path: Path, proxy_url: str, env: dict[str, str]) -> World:
    sandbox.app_state.reset()
    catalog = parse_identities(
        f'tiers: [datacenter]\nidentities:\n  - {{id: px_lone, proxy_url: "{proxy_url}", range: r9, '
        "tier: datacenter}\n", env=env)
    pool = IdentityPool(store, catalog, rng=random.Random(1))
    fetcher = _fetcher(store, pool)
    records = RecordStore(tmp_path / "records")
    sources = parse_sources(SOURCES.format(url=sandbox.url))
    return World(store, sources, pool, fetcher, Collector(catalog=sources, store=store, records=records,
                                                          fetcher=fetcher), records)


def test_a_proxy_refusing_the_password_rests_the_identity(sandbox, sqlite_store: StateStore, tmp_path: Path) -> None:
    with start_proxies(["127.0.0.5"], credentials=("fleet", "the-right-one")) as guarded:
        lone = _lone_identity_world(sandbox, sqlite_store, tmp_path, f"http://fleet:${{PW}}@{guarded[0].host}:"
                                    f"{guarded[0].port}", env={"PW": "a-wrong-one"})
        try:
            with pytest.raises(CollectionParked):
                lone.collector.collect("robust", lone.lead("one.example"))
        finally:
            lone.fetcher.close()
            lone.pool.close()
        assert (guarded[0].stats.auth_refused, guarded[0].stats.forwarded) == (1, 0)
    health = lone.pool.health("px_lone", "robust")
    assert health is not None and health.state == "resting"


def test_an_unreachable_proxy_rests_the_identity_not_the_source(
    sandbox, sqlite_store: StateStore, tmp_path: Path
) -> None:
    lone = _lone_identity_world(sandbox, sqlite_store, tmp_path, "http://127.0.0.5:9", env={})
    try:
        with pytest.raises(CollectionParked):
            lone.collector.collect("robust", lone.lead("one.example"))
    finally:
        lone.fetcher.close()
        lone.pool.close()
    health = lone.pool.health("px_lone", "robust")
    assert health is not None and health.state == "resting"
    assert sqlite_store.dead_letters() == []
