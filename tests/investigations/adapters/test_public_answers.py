"""The public sources' recorded answers (tests/fixtures/public), read the way the fleet reads them:
through the fetcher's classification and each source's own rules, then its adapter's parser.

Every source has a normal, an empty, an error and a throttled answer; "no result" (empty) and
"blocked / failed / throttled" must never be confused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from investigations.adapters import ParseError, PlannedRequest, build_adapter
from investigations.adapters.cache import BOOTSTRAPS, TtlCache
from investigations.adapters.cdx import newest_index
from investigations.adapters.rdap import parse_bootstrap, server_for
from investigations.collection.classify import Answer
from investigations.collection.events import Outcome
from investigations.collection.fetcher import Fetcher, FetchFailed, FetchParked
from investigations.identities import IdentityPool, parse_identities
from investigations.intake.leads import normalize_lead
from investigations.sources.specs import parse_sources
from tests.fakes import FakeTime
from tests.public_sources import NOW, PUBLIC_SOURCES, public_catalog, recorded

CATALOG = public_catalog()

# The request each source's answer comes back to (the lookup itself, after any bootstrap).
LOOKUP_URLS = {
    "crtsh": "https://crt.sh/?q=%25.example.com&output=json",
    "wayback": "https://web.archive.org/cdx/search/cdx?url=example.com&output=json&showResumeKey=true&matchType=domain",
    "rdap": "https://rdap.verisign.com/com/v1/domain/example.com",
    "dns": "https://dns.google/resolve?name=example.com&type=A",
    "hackernews": "https://hn.algolia.com/api/v1/search?query=example.com&hitsPerPage=100",
    "github_users": "https://api.github.com/users/octocat",
    "github_orgs": "https://api.github.com/orgs/github",
    "mastodon": "https://mastodon.social/api/v1/accounts/lookup?acct=gargron",
    "commoncrawl": "https://index.commoncrawl.org/CC-MAIN-2026-47-index?url=example.com&output=json&limit=1000&matchType=domain",
}


class Sink:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def record_fetch(self, event: Any) -> None:
        self.events.append(event)


@dataclass
class Read:
    """What the fleet makes of one answer: outcome ok/empty/failed/parked, records, and the detail."""

    outcome: str
    records: list[Any]
    reason: str | None = None  # failed: the reason group; parked: None
    retry_in_s: float | None = None  # parked: when the work comes back
    sleeps: list[float] | None = None
    events: list[Any] | None = None


def read(source: str, answer: str) -> Read:
    """Send the source's lookup to a transport that always plays `answer`, as the collector would."""
    spec = CATALOG.get(source)
    adapter = build_adapter(spec)
    answer_ = recorded(source, answer)
    time, sink = FakeTime(), Sink()
    fetcher = Fetcher(sink=sink, transport=httpx.MockTransport(lambda request: answer_.response()),
                      sleep=time.sleep, clock=time.clock, now=lambda: NOW)
    planned = PlannedRequest("GET", LOOKUP_URLS[source], adapter.headers())
    try:
        result = fetcher.fetch(spec, planned, lead_id="lead-1", judge=adapter)
    except FetchFailed as failed:
        return Read("failed", [], reason=failed.reason_group, sleeps=time.slept, events=sink.events)
    except FetchParked as parked:
        return Read("parked", [], retry_in_s=parked.retry_in_s, sleeps=time.slept, events=sink.events)
    finally:
        fetcher.close()
    records = [] if result.empty else adapter.parse(result.body, url=result.url)
    return Read("ok" if records else "empty", records, sleeps=time.slept, events=sink.events)


def fields(found: Read) -> list[dict[str, Any]]:
    return [record.fields for record in found.records]


# -- every source, every answer ---------------------------------------------------------------------

OUTCOMES = [
    # source, answer, outcome, records or reason group
    ("crtsh", "normal", "ok", 2), ("crtsh", "empty", "empty", 0),
    ("crtsh", "error", "failed", "transient"), ("crtsh", "throttled", "parked", None),
    ("wayback", "normal", "ok", 3), ("wayback", "empty", "empty", 0),
    ("wayback", "error", "failed", "transient"), ("wayback", "throttled", "parked", None),
    ("rdap", "normal", "ok", 1), ("rdap", "empty", "empty", 0),
    ("rdap", "error", "failed", "permanent"), ("rdap", "throttled", "parked", None),
    ("dns", "normal", "ok", 2), ("dns", "empty", "empty", 0), ("dns", "nodata", "empty", 0),
    ("dns", "error", "failed", "transient"), ("dns", "throttled", "parked", None),
    ("hackernews", "normal", "ok", 2), ("hackernews", "empty", "empty", 0),
    ("hackernews", "error", "failed", "permanent"), ("hackernews", "throttled", "parked", None),
    ("github_users", "normal", "ok", 1), ("github_users", "empty", "empty", 0),
    ("github_users", "error", "failed", "blocked"), ("github_users", "throttled", "parked", None),
    ("github_users", "throttled_secondary", "parked", None), ("github_users", "forbidden", "failed", "blocked"),
    ("github_orgs", "normal", "ok", 1), ("github_orgs", "empty", "empty", 0),
    ("github_orgs", "error", "failed", "transient"), ("github_orgs", "throttled", "parked", None),
    ("mastodon", "normal", "ok", 1), ("mastodon", "empty", "empty", 0),
    ("mastodon", "error", "failed", "blocked"), ("mastodon", "throttled", "parked", None),
    ("commoncrawl", "normal", "ok", 2), ("commoncrawl", "empty", "empty", 0),
    ("commoncrawl", "error", "failed", "transient"), ("commoncrawl", "throttled", "parked", None),
]


@pytest.mark.parametrize(("source", "answer", "outcome", "detail"), OUTCOMES,
                         ids=[f"{s}-{a}" for s, a, *_ in OUTCOMES])
def test_each_recorded_answer_has_its_outcome(source: str, answer: str, outcome: str, detail: Any) -> None:
    found = read(source, answer)
    assert found.outcome == outcome
    if outcome in ("ok", "empty"):
        assert len(found.records) == detail
    elif outcome == "failed":
        assert found.reason == detail


def test_every_public_source_has_the_four_recorded_answers() -> None:
    covered = {(source, answer) for source, answer, *_ in OUTCOMES}
    for spec in CATALOG.sources:
        assert {(spec.name, a) for a in ("normal", "empty", "error", "throttled")} <= covered


# -- parsers: what the records hold -----------------------------------------------------------------


def test_crtsh_certificates_keep_their_names_issuer_and_dates() -> None:
    [first, second] = sorted(read("crtsh", "normal").records, key=lambda r: r.key)
    assert first.key == "12044578866"
    assert first.fields["names"] == "*.example.com\nexample.com"
    assert second.fields["issuer"] == "C=US, O=Let's Encrypt, CN=R11"
    assert second.fields["not_after"] == "2027-01-31T07:16:31"


def test_crtsh_502_is_retried_then_transient_never_empty() -> None:
    found = read("crtsh", "error")
    assert [e.status for e in found.events] == [502, 502, 502]  # attempts: 3
    assert {e.outcome for e in found.events} == {Outcome.TRANSIENT}


def test_wayback_rows_become_captures_keyed_by_urlkey_and_timestamp() -> None:
    records = read("wayback", "normal").records
    assert sorted(r.key for r in records) == ["com,example)/ 20020120142510", "com,example)/ 20140102030405",
                                              "com,example)/about 20150301000000"]
    about = next(r for r in records if "about" in r.key)
    assert about.fields == {"url": "http://www.example.com/about", "timestamp": "20150301000000", "mime": "text/html",
                            "status": "301", "digest": "3I42H3S6NNFQ2MSVX7XZKYAYSCX5QBYJ", "length": "428"}
    assert about.url == "http://www.example.com/about"


def test_wayback_stops_at_the_resume_key_after_the_last_capture() -> None:
    body = (b'[["urlkey","timestamp","original"],["com,example)/","20020120142510","http://example.com/"],'
            b'[],["com,example)/+20020120142510"]]')
    records = build_adapter(CATALOG.get("wayback")).parse(body, url=LOOKUP_URLS["wayback"])
    assert [r.key for r in records] == ["com,example)/ 20020120142510"]


def test_wayback_429_waits_its_retry_after_before_parking() -> None:
    found = read("wayback", "throttled")
    assert found.sleeps and found.sleeps[0] >= 60
    assert all(e.status == 429 for e in found.events)


def test_rdap_domain_keeps_registration_facts_but_not_the_database_update_time() -> None:
    [record] = read("rdap", "normal").records
    assert record.key == "2336799_DOMAIN_COM-VRSN"
    assert record.fields["ldh_name"] == "example.com"
    assert record.fields["registrar"] == "RESERVED-Internet Assigned Numbers Authority"
    assert record.fields["registrar_iana_id"] == "376"
    assert (record.fields["registered_at"], record.fields["expires_at"]) == ("1995-08-14T04:00:00Z", "2027-08-13T04:00:00Z")
    assert record.fields["nameservers"] == ["a.iana-servers.net", "b.iana-servers.net"]
    assert record.fields["dnssec"] is True
    assert "2026-12-03T18:52:11Z" not in str(record.fields)
    assert record.url == "https://rdap.verisign.com/com/v1/domain/EXAMPLE.COM"


def test_rdap_answer_that_is_not_a_domain_is_unparseable() -> None:
    with pytest.raises(ParseError, match="not a domain object"):
        build_adapter(CATALOG.get("rdap")).parse(b'{"objectClassName":"entity"}', url=LOOKUP_URLS["rdap"])


def test_rdap_bootstrap_maps_each_tld_to_its_server_preferring_https() -> None:
    services = parse_bootstrap(recorded("rdap", "bootstrap").body)
    assert services["com"] == services["net"] == "https://rdap.verisign.com/com/v1/"
    assert services["co.uk"] == "https://rdap.nominet.uk/uk/"
    assert server_for(services, "shop.example.co.uk") == "https://rdap.nominet.uk/uk/"
    assert server_for(services, "example.invalid") is None


def test_dns_answers_are_records_without_their_ttl() -> None:
    records = read("dns", "normal").records
    assert sorted(r.fields["data"] for r in records) == ["93.184.215.14", "96.7.128.175"]
    assert records[0].fields.keys() == {"name", "type", "data"}
    assert records[0].fields["type"] == "A" and records[0].fields["name"] == "example.com"


def test_dns_nxdomain_is_empty_and_servfail_is_a_retried_failure() -> None:
    assert read("dns", "empty").events[-1].outcome is Outcome.OK
    failed = read("dns", "error")
    assert [e.outcome for e in failed.events] == [Outcome.TRANSIENT] * 3
    assert failed.events[-1].error == "HTTP 200 with DNS SERVFAIL"


def test_hackernews_hits_keep_story_and_comment_fields() -> None:
    records = {r.key: r for r in read("hackernews", "normal").records}
    assert records["8863"].fields["title"] == "Example.com is reserved for documentation"
    assert records["8863"].fields["points"] == 111
    assert records["8952"].fields["author"] == "dang" and records["8952"].fields["story_id"] == 8863


def test_github_user_profile_is_one_record() -> None:
    [record] = read("github_users", "normal").records
    assert record.key == "583231"
    assert (record.fields["login"], record.fields["type"], record.fields["location"]) == ("octocat", "User", "San Francisco")
    assert record.url == "https://github.com/octocat"


def test_github_primary_limit_parks_until_its_reset_without_spending_attempts() -> None:
    found = read("github_users", "throttled")
    assert found.sleeps == []  # the reset is 20 min away, past park_after_s: parked at once
    assert found.retry_in_s == pytest.approx(1200)
    assert len(found.events) == 1 and found.events[0].outcome is Outcome.THROTTLED


def test_github_secondary_limit_waits_its_retry_after() -> None:
    found = read("github_users", "throttled_secondary")
    assert found.sleeps and found.sleeps[0] >= 90
    assert {e.outcome for e in found.events} == {Outcome.THROTTLED}


def test_github_403_without_rate_limit_signs_is_blocked() -> None:
    assert {e.outcome for e in read("github_users", "forbidden").events} == {Outcome.BLOCKED}


def test_github_last_allowance_answers_ok_and_floors_the_lane_until_reset() -> None:
    spec = CATALOG.get("github_users")
    answer = recorded("github_users", "last_allowance")
    verdict = build_adapter(spec).judge(Answer(answer.status, answer.headers, answer.body), now=NOW)
    assert verdict is not None and verdict.outcome is Outcome.OK and verdict.retry_after_s == pytest.approx(1200)


def test_github_org_is_one_record() -> None:
    [record] = read("github_orgs", "normal").records
    assert (record.key, record.fields["login"], record.fields["is_verified"]) == ("9919", "github", True)


def test_mastodon_account_is_one_record() -> None:
    [record] = read("mastodon", "normal").records
    assert record.key == "1"
    assert (record.fields["acct"], record.fields["followers"]) == ("Gargron", 320000)
    assert record.url == "https://mastodon.social/@Gargron"


def test_mastodon_429_parks_until_its_iso_reset() -> None:
    found = read("mastodon", "throttled")
    assert found.retry_in_s == pytest.approx(300.02, abs=0.01)


def test_commoncrawl_lines_become_captures() -> None:
    records = {r.key: r for r in read("commoncrawl", "normal").records}
    capture = records["com,example)/ 20261109051503"]
    assert capture.fields["status"] == "200"
    assert capture.fields["filename"].startswith("crawl-data/CC-MAIN-2026-47/")
    assert capture.url == "https://example.com/"


def test_commoncrawl_503_slows_down_without_spending_attempts() -> None:
    found = read("commoncrawl", "throttled")
    assert found.outcome == "parked"  # waited, then back in the queue: never a failure
    assert {e.status for e in found.events} == {503}


def test_commoncrawl_newest_index_is_chosen_by_id_not_by_order() -> None:
    body = (b'[{"id":"CC-MAIN-2026-43","cdx-api":"https://index.commoncrawl.org/CC-MAIN-2026-43-index"},'
            b'{"id":"CC-MAIN-2026-47","cdx-api":"https://index.commoncrawl.org/CC-MAIN-2026-47-index"}]')
    assert newest_index(body) == "https://index.commoncrawl.org/CC-MAIN-2026-47-index"
    assert newest_index(recorded("commoncrawl", "collinfo").body).endswith("CC-MAIN-2026-47-index")
    with pytest.raises(ParseError):
        newest_index(b"[]")


# -- planning: what each source is asked ------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_cached_bootstraps():
    BOOTSTRAPS.clear()
    yield
    BOOTSTRAPS.clear()


def test_cdx_match_type_follows_the_lead_kind() -> None:
    adapter = build_adapter(CATALOG.get("wayback"))
    [domain] = adapter.requests_for(normalize_lead("domain", "example.com"))
    [url] = adapter.requests_for(normalize_lead("url", "https://example.com/a?b=1"))
    assert domain.url.endswith("url=example.com&output=json&collapse=digest&limit=1000&showResumeKey=true&matchType=domain")
    assert "url=https%3A%2F%2Fexample.com%2Fa%3Fb%3D1&" in url.url and url.url.endswith("&matchType=exact")


def test_commoncrawl_asks_the_collection_list_once_then_the_newest_index() -> None:
    adapter = build_adapter(CATALOG.get("commoncrawl"))
    lead = normalize_lead("domain", "example.com")
    [first] = adapter.requests_for(lead)
    assert (first.url, first.collects) == ("https://index.commoncrawl.org/collinfo.json", False)
    [query] = adapter.follow(lead, first, recorded("commoncrawl", "collinfo").body)
    assert query.url == LOOKUP_URLS["commoncrawl"] and query.collects
    assert adapter.requests_for(lead) == [query]  # cached: no second look at the list


def test_rdap_asks_the_bootstrap_once_then_the_registry() -> None:
    adapter = build_adapter(CATALOG.get("rdap"))
    lead = normalize_lead("domain", "example.com")
    [bootstrap] = adapter.requests_for(lead)
    assert (bootstrap.url, bootstrap.collects) == ("https://data.iana.org/rdap/dns.json", False)
    [lookup] = adapter.follow(lead, bootstrap, recorded("rdap", "bootstrap").body)
    assert lookup.url == LOOKUP_URLS["rdap"]
    assert adapter.requests_for(lead) == [lookup]


def test_rdap_tld_without_a_server_cannot_be_asked() -> None:
    adapter = build_adapter(CATALOG.get("rdap"))
    lead = normalize_lead("domain", "shop.example")
    [bootstrap] = adapter.requests_for(lead)
    with pytest.raises(ParseError, match="no RDAP service for .example"):
        adapter.follow(lead, bootstrap, recorded("rdap", "bootstrap").body)


def test_dns_asks_each_type_in_turn() -> None:
    adapter = build_adapter(CATALOG.get("dns"))
    lead = normalize_lead("domain", "example.com")
    asked = adapter.requests_for(lead)
    while asked[-1:]:
        more = adapter.follow(lead, asked[-1], b"")
        if not more:
            break
        asked += more
    assert [r.url.rsplit("type=", 1)[1] for r in asked] == ["A", "AAAA", "MX", "NS", "TXT"]


def test_github_token_is_sent_as_a_bearer_header_only_when_set() -> None:
    lead = normalize_lead("username", "octocat")
    [anonymous] = build_adapter(CATALOG.get("github_users")).requests_for(lead)
    [authorized] = build_adapter(public_catalog({"GITHUB_TOKEN": "ghp_test_token_0123456789"}).get("github_users")).requests_for(lead)
    assert "Authorization" not in anonymous.headers
    assert authorized.headers["Authorization"] == "Bearer ghp_test_token_0123456789"
    assert authorized.headers["X-GitHub-Api-Version"] == "2022-11-28"


def test_a_server_named_by_a_bootstrap_file_gets_only_the_accept_header() -> None:
    text = (PUBLIC_SOURCES.read_text().replace('headers: {Accept: "application/rdap+json, application/json"}',
                                               'headers: {Accept: application/rdap+json, X-Api-Key: "${RDAP_KEY}"}'))
    spec = parse_sources(text, env={"RDAP_KEY": "key-for-iana-only-0123"}).get("rdap")
    adapter = build_adapter(spec)
    lead = normalize_lead("domain", "example.com")
    [bootstrap] = adapter.requests_for(lead)
    [lookup] = adapter.follow(lead, bootstrap, recorded("rdap", "bootstrap").body)
    assert bootstrap.headers == {"Accept": "application/rdap+json", "X-Api-Key": "key-for-iana-only-0123"}
    assert lookup.headers == {"Accept": "application/rdap+json"}


def test_hackernews_asks_further_pages_while_there_are_some_up_to_its_cap() -> None:
    adapter = build_adapter(CATALOG.get("hackernews"))
    lead = normalize_lead("domain", "example.com")
    [first] = adapter.requests_for(lead)
    [second] = adapter.follow(lead, first, b'{"hits": [], "nbPages": 7, "page": 0}')
    [third] = adapter.follow(lead, second, b'{"hits": [], "nbPages": 7, "page": 1}')
    assert (second.page, third.page) == (1, 2)
    assert second.url.endswith("query=example.com&hitsPerPage=100&page=1") and third.url.endswith("&page=2")
    assert adapter.follow(lead, third, b'{"hits": [], "nbPages": 7, "page": 2}') == []  # max_pages: 3
    assert adapter.follow(lead, first, recorded("hackernews", "normal").body) == []  # nbPages: 1


def test_wayback_follows_its_resume_key_up_to_its_cap() -> None:
    adapter = build_adapter(CATALOG.get("wayback"))
    lead = normalize_lead("domain", "example.com")
    [first] = adapter.requests_for(lead)
    page = b'[["urlkey","timestamp"],["com,example)/","20020120142510"],[],["com,example)/ 20020120142510"]]'
    [second] = adapter.follow(lead, first, page)
    assert second.page == 1 and second.url.endswith("&resumeKey=com%2Cexample%29%2F%2020020120142510")
    [third] = adapter.follow(lead, second, page)
    assert adapter.follow(lead, third, page) == []  # max_pages: 3
    assert adapter.follow(lead, first, recorded("wayback", "normal").body) == []  # no resume key: the last page


# -- what an answer says about the identity that got it ---------------------------------------------

IDENTITY = """
tiers: [datacenter]
fingerprints:
  plain: {user_agent: "Mozilla/5.0 (X11; Linux x86_64) Firefox/125.0", accept_language: "en", headers: []}
identities:
  - {id: home, tier: datacenter, fingerprint: plain, range: home}
"""


def identity_state_after(source: str, answer: str, sqlite_store) -> str:
    pool = IdentityPool(sqlite_store, parse_identities(IDENTITY), rng=random.Random(1))
    spec, played = CATALOG.get(source), recorded(source, answer)
    time = FakeTime()
    fetcher = Fetcher(sink=Sink(), transport=httpx.MockTransport(lambda request: played.response()), pool=pool,
                      sleep=time.sleep, clock=time.clock, now=lambda: NOW)
    lease = pool.acquire(source, holder="test", ttl_s=600)
    assert lease is not None
    try:
        fetcher.fetch(spec, PlannedRequest("GET", LOOKUP_URLS[source]), lead_id="lead-1", session=fetcher.sessions.open(lease),
                      judge=build_adapter(spec))
    except Exception:  # parked, failed or blocked: the identity's health is what this looks at
        pass
    finally:
        fetcher.close()
        pool.release(lease)
    health = pool.health("home", source)
    pool.close()
    return "healthy" if health is None else health.state


def test_github_rate_limit_403_does_not_rest_the_identity_as_a_block_would(sqlite_store) -> None:
    assert identity_state_after("github_users", "throttled", sqlite_store) == "healthy"


def test_github_plain_403_rests_the_identity(sqlite_store) -> None:
    assert identity_state_after("github_users", "forbidden", sqlite_store) == "resting"


def test_dns_servfail_is_held_against_the_source_not_the_identity(sqlite_store) -> None:
    assert identity_state_after("dns", "error", sqlite_store) == "healthy"


def test_commoncrawl_503_waits_at_least_a_minute_each_time() -> None:
    found = read("commoncrawl", "throttled")
    assert found.sleeps and min(found.sleeps) >= 60


def test_a_cached_bootstrap_is_forgotten_after_its_ttl() -> None:
    time = FakeTime()
    cache = TtlCache(clock=time.clock)
    cache.put("rdap https://data.iana.org/rdap/dns.json", {"com": "https://rdap.verisign.com/com/v1/"})
    time.sleep(86399)
    assert cache.get("rdap https://data.iana.org/rdap/dns.json", ttl_s=86400) is not None
    time.sleep(1)
    assert cache.get("rdap https://data.iana.org/rdap/dns.json", ttl_s=86400) is None


def test_a_cache_in_a_directory_is_shared_and_survives_a_broken_file(tmp_path) -> None:
    time = FakeTime()
    TtlCache(tmp_path, clock=time.clock).put("cdx https://index.commoncrawl.org/collinfo.json", "https://x/CC-index")
    assert TtlCache(tmp_path, clock=time.clock).get("cdx https://index.commoncrawl.org/collinfo.json",
                                                    ttl_s=60) == "https://x/CC-index"
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    assert TtlCache(tmp_path, clock=time.clock).get("cdx https://index.commoncrawl.org/collinfo.json", ttl_s=60) is None
