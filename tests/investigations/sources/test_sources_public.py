"""sources.public.yaml loads through the fleet's own loader, and each source keeps to its limits."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from assets.naming import source_asset_key
from definitions import build_definitions
from investigations.config import Settings
from investigations.sources.catalog import load_catalog
from investigations.sources.specs import SpecError, parse_sources
from tests.public_sources import PUBLIC_SOURCES

# source -> (lead kinds, the most requests per second it may send: its published or observed limit)
EXPECTED = {
    "crtsh": (("domain",), 0.5),  # no published limit; Amass keeps to one per 2 s
    "wayback": (("domain", "url"), 24 / 60),  # 24 searches/min, hard limit
    "rdap": (("domain",), 0.5),  # registries vary; Amass keeps to one per 2 s
    "dns": (("domain",), 1000.0),  # Google Public DNS: 1,000+ QPS per address
    "hackernews": (("domain", "org", "url"), 10_000 / 3600),  # commonly cited 10,000/h
    "github_users": (("username",), 60 / 3600 / 2),  # 60/h anonymous, shared with github_orgs
    "github_orgs": (("org",), 60 / 3600 / 2),
    "mastodon": (("username",), 300 / 300),  # 300 per 5 min per address
    "commoncrawl": (("domain", "url"), 100_000 / 3600 / 100),  # a server shared by everyone: a hundredth of it
}


@pytest.fixture
def catalog(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    settings = Settings.from_env({"INVESTIGATIONS_SOURCES": str(PUBLIC_SOURCES)})
    return load_catalog(settings.sources_path)


def test_every_public_source_is_declared_with_its_lead_kinds(catalog) -> None:
    assert catalog.names == list(EXPECTED)
    for spec in catalog.sources:
        assert spec.lead_kinds == EXPECTED[spec.name][0], spec.name


def test_every_public_source_keeps_under_its_published_rate(catalog) -> None:
    for spec in catalog.sources:
        limit_per_s = EXPECTED[spec.name][1]
        assert spec.rate.source_per_s <= limit_per_s, spec.name
        assert spec.rate.identity_per_s <= spec.rate.source_per_s, spec.name
        # a burst of requests at once is what a throttle sees first
        assert spec.rate.source_burst <= max(1, int(limit_per_s)), spec.name


def test_public_sources_cover_at_least_eight_services_over_https(catalog) -> None:
    hosts = {urlsplit(spec.request.url).hostname for spec in catalog.sources}
    assert len(hosts) >= 8
    assert all(spec.request.url.startswith("https://") for spec in catalog.sources)


def test_public_sources_are_keyless_and_free(catalog) -> None:
    for spec in catalog.sources:
        assert spec.daily_budget_usd == 0
        assert spec.request.bearer_token == ""  # GITHUB_TOKEN is optional
        assert not any("key" in name.lower() for name in spec.request.headers)


def test_the_fleet_builds_one_asset_per_public_source(catalog) -> None:
    defs = build_definitions(Settings.from_env({"INVESTIGATIONS_SOURCES": str(PUBLIC_SOURCES)}))
    graph = defs.resolve_asset_graph()
    for spec in catalog.sources:
        assert graph.get(source_asset_key(spec.name)).partitions_def.name == "leads"


@pytest.mark.parametrize(
    ("typo", "message"),
    [
        (("answers: {empty_statuses: [404]}", "answers: {empty_status: [404]}"),
         "source 'rdap': key 'answers.empty_status': unknown key"),
        (("pages: {param: page, count_path: nbPages, first: 0, max_pages: 3}",
          "pages: {param: page, count_path: nbPages, first: 0, max_pages: 30}"),
         "source 'hackernews': key 'parse.pages.max_pages'"),
        (("parse: {types: [A, AAAA, MX, NS, TXT]}", "parse: {types: [A, AAAB]}"),
         "source 'dns': key 'parse.types': unknown record types ['AAAB']"),
        (("reset_format: iso,", "reset_format: unix,"), "source 'mastodon': key 'answers.rate_limit.reset_format'"),
    ],
)
def test_a_typo_in_the_public_sources_fails_at_load_naming_the_key(typo: tuple[str, str], message: str) -> None:
    text = PUBLIC_SOURCES.read_text()
    assert typo[0] in text
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_sources(text.replace(typo[0], typo[1]), origin="sources.public.yaml", env={})
