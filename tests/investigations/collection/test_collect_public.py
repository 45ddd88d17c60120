"""The fleet's collect path against the public sources' recorded answers, played on loopback.

`sources.public.yaml` is loaded as the fleet loads it, with each base url pointed at a loopback
server that plays tests/fixtures/public; the collector, the fetcher (SSRF guard and pinned
connections included) and the record store run as they do in production.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from assets.sources import build_source_asset
from investigations.adapters.cache import BOOTSTRAPS, TtlCache
from investigations.collection.collect import CollectionFailed, CollectionParked, Collector
from investigations.collection.fetcher import Fetcher
from investigations.evidence.records import RecordStore
from investigations.intake.leads import Lead, normalize_lead
from investigations.store import StateStore
from resources.fleet import FleetResource
from tests.fakes import FakeTime
from tests.public_sources import NOW, PUBLIC_SOURCES, RecordedWeb, public_catalog, recorded_web

DOMAIN = normalize_lead("domain", "example.com")
LEADS = {
    "crtsh": DOMAIN, "wayback": DOMAIN, "rdap": DOMAIN, "dns": DOMAIN, "hackernews": DOMAIN, "commoncrawl": DOMAIN,
    "github_users": normalize_lead("username", "octocat"), "github_orgs": normalize_lead("org", "github"),
    "mastodon": normalize_lead("username", "gargron"),
}
# Records of each source's normal answer (dns: two A records and one MX; AAAA, NS and TXT have none).
NORMAL_RECORDS = {"crtsh": 2, "wayback": 3, "rdap": 1, "dns": 3, "hackernews": 2, "github_users": 1,
                  "github_orgs": 1, "mastodon": 1, "commoncrawl": 2}
ERROR_REASONS = {"crtsh": "transient", "wayback": "transient", "rdap": "permanent", "dns": "transient",
                 "hackernews": "permanent", "github_users": "blocked", "github_orgs": "transient",
                 "mastodon": "blocked", "commoncrawl": "transient"}


@dataclass
class World:
    web: RecordedWeb
    store: StateStore
    records: RecordStore
    collector: Collector

    def collect(self, source: str):
        lead = LEADS[source]
        self.store.add_lead(lead, case_id="case-1")
        return self.collector.collect(source, lead.id, run_id="run-1")


@pytest.fixture
def world(sqlite_store: StateStore, tmp_path: Path) -> Iterator[World]:
    BOOTSTRAPS.clear()
    time = FakeTime()  # retries and rate-limit waits pass at once, and parking is decided on this clock
    with recorded_web() as web:
        fetcher = Fetcher(sink=sqlite_store, sleep=time.sleep, clock=time.clock, now=lambda: NOW)
        records = RecordStore(tmp_path / "records")
        collector = Collector(catalog=public_catalog(web.env), store=sqlite_store, records=records, fetcher=fetcher,
                              clock=time.clock, sleep=time.sleep)
        try:
            yield World(web, sqlite_store, records, collector)
        finally:
            fetcher.close()
            BOOTSTRAPS.clear()


@pytest.mark.parametrize("source", list(LEADS))
def test_normal_answers_are_collected_into_records(world: World, source: str) -> None:
    result = world.collect(source)
    assert (result.outcome, result.records) == ("ok", NORMAL_RECORDS[source])
    assert world.records.read(source, LEADS[source].id).num_rows == NORMAL_RECORDS[source]
    assert world.store.collection(source, LEADS[source].id).outcome == "ok"


@pytest.mark.parametrize("source", list(LEADS))
def test_empty_answers_are_an_empty_result_not_a_failure(world: World, source: str) -> None:
    world.web.scenario[source] = "empty"
    result = world.collect(source)
    assert (result.outcome, result.records) == ("empty", 0)
    assert world.store.dead_letters(source=source) == []


@pytest.mark.parametrize("source", list(LEADS))
def test_error_answers_fail_with_the_source_s_reason(world: World, source: str) -> None:
    world.web.scenario[source] = "error"
    with pytest.raises(CollectionFailed) as failed:
        world.collect(source)
    assert failed.value.reason_group == ERROR_REASONS[source]
    (letter,) = world.store.dead_letters(source=source)
    assert letter.reason_group == ERROR_REASONS[source]


@pytest.mark.parametrize("source", list(LEADS))
def test_throttled_answers_park_the_collection_never_fail_it(world: World, source: str) -> None:
    world.web.scenario[source] = "throttled"
    with pytest.raises(CollectionParked):
        world.collect(source)
    assert world.store.dead_letters(source=source) == []


def test_rdap_bootstrap_is_asked_once_for_many_leads(world: World) -> None:
    world.collect("rdap")
    other = normalize_lead("domain", "example.net")
    world.store.add_lead(other, case_id="case-1")
    world.collector.collect("rdap", other.id)
    asked = [path for path, _ in world.web.requests]
    assert asked == ["/rdap/dns.json", "/rdap/com/v1/domain/example.com", "/rdap/com/v1/domain/example.net"]


def test_dns_stops_asking_after_nxdomain(world: World) -> None:
    world.web.scenario["dns"] = "empty"
    world.collect("dns")
    assert [path for path, _ in world.web.requests] == ["/dns/resolve?name=example.com&type=A"]


def test_commoncrawl_asks_the_newest_index(world: World) -> None:
    world.collect("commoncrawl")
    assert [path for path, _ in world.web.requests] == [
        "/commoncrawl/collinfo.json",
        "/commoncrawl/CC-MAIN-2026-47-index?url=example.com&output=json&limit=1000&matchType=domain",
    ]


def test_github_is_asked_anonymously_without_a_token(world: World) -> None:
    world.collect("github_users")
    [(path, headers)] = world.web.requests
    assert path == "/github/users/octocat"
    assert "authorization" not in headers and headers["x-github-api-version"] == "2022-11-28"


def test_a_dagster_run_materializes_a_public_source_from_recordings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The asset the fleet runs, with sources.public.yaml as its sources file (INVESTIGATIONS_SOURCES)."""
    BOOTSTRAPS.clear()
    with recorded_web() as web:
        for name, value in web.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(PUBLIC_SOURCES))
        monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(tmp_path / "data"))
        resource = FleetResource()
        store = StateStore.from_url(resource.settings().database_url)
        try:
            lead: Lead = DOMAIN
            store.add_lead(lead, case_id="case-1")
            instance = DagsterInstance.ephemeral()
            instance.add_dynamic_partitions("leads", [lead.id])
            result = materialize([build_source_asset(resource.catalog.get("dns"))], partition_key=lead.id,
                                 instance=instance, resources={"fleet": resource})
        finally:
            store.close()
    assert result.success
    (mat,) = result.asset_materializations_for_node("sources__dns")
    assert (mat.metadata["records"].value, mat.metadata["outcome"].value) == (3, "ok")
    assert mat.metadata["requests"].value == 5


def test_github_token_goes_to_github_only_and_is_written_nowhere(sqlite_store: StateStore, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    token = "ghp_canary0123456789abcdefghijklmnop"
    BOOTSTRAPS.clear()
    time = FakeTime()
    with recorded_web() as web:
        web.scenario["github_users"] = "error"  # a 401: a dead letter with the last error in it
        fetcher = Fetcher(sink=sqlite_store, sleep=time.sleep, clock=time.clock, now=lambda: NOW)
        catalog = public_catalog({**web.env, "GITHUB_TOKEN": token})
        collector = Collector(catalog=catalog, store=sqlite_store, records=RecordStore(tmp_path / "records"),
                              fetcher=fetcher, clock=time.clock, sleep=time.sleep)
        lead = LEADS["github_users"]
        sqlite_store.add_lead(lead, case_id="case-1")
        try:
            with caplog.at_level("DEBUG"), pytest.raises(CollectionFailed):
                collector.collect("github_users", lead.id)
        finally:
            fetcher.close()
    assert {headers["authorization"] for _, headers in web.requests} == {f"Bearer {token}"}
    assert token not in caplog.text
    written = [path for path in tmp_path.rglob("*") if path.is_file() and token.encode() in path.read_bytes()]
    assert written == []


def test_crtsh_is_asked_for_the_domain_and_its_subdomains(world: World) -> None:
    world.collect("crtsh")
    assert [path for path, _ in world.web.requests] == ["/crtsh/?q=%25.example.com&output=json"]


def test_runs_sharing_a_data_dir_share_the_bootstrap_file(world: World, tmp_path: Path) -> None:
    """Each interactive run is its own process; the cache in the data dir spares each the bootstrap."""
    other = normalize_lead("domain", "example.net")
    world.store.add_lead(LEADS["rdap"], case_id="case-1")
    world.store.add_lead(other, case_id="case-1")
    for lead in (LEADS["rdap"], other):
        run = Collector(catalog=world.collector.catalog, store=world.store, records=world.records,
                        fetcher=world.collector.fetcher, cache=TtlCache(tmp_path / "cache"))
        assert run.collect("rdap", lead.id).outcome == "ok"
    asked = [path for path, _ in world.web.requests]
    assert asked == ["/rdap/dns.json", "/rdap/com/v1/domain/example.com", "/rdap/com/v1/domain/example.net"]
