"""One real lookup per public source, through the fleet's collect path: does each source still
answer in the shape its adapter reads? Run by hand (`pytest -m live`), never in CI.

A lookup is one request, plus the bootstrap file or collection list where the source needs one
first (rdap, commoncrawl); dns asks only for A records. GITHUB_TOKEN is used when set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from investigations.adapters.cache import BOOTSTRAPS
from investigations.adapters.doh import DohParse
from investigations.collection.collect import Collector
from investigations.collection.fetcher import Fetcher
from investigations.evidence.records import RecordStore
from investigations.intake.leads import normalize_lead
from investigations.sources.specs import SourceCatalog
from investigations.store import StateStore
from tests.public_sources import public_catalog

pytestmark = pytest.mark.live

# Leads every source has something on, so an empty answer is a change worth looking at.
LEADS = {
    "crtsh": ("domain", "example.com"),
    "wayback": ("domain", "example.com"),
    "rdap": ("domain", "example.com"),
    "dns": ("domain", "example.com"),
    "hackernews": ("domain", "example.com"),
    "github_users": ("username", "octocat"),
    "github_orgs": ("org", "github"),
    "mastodon": ("username", "gargron"),
    "commoncrawl": ("domain", "example.com"),
}


def _catalog() -> SourceCatalog:
    catalog = public_catalog(dict(os.environ))
    specs = [spec.model_copy(update={"parse": DohParse(types=("A",))}) if spec.name == "dns" else spec
             for spec in catalog.sources]
    return SourceCatalog(sources=tuple(specs))


@pytest.mark.parametrize("source", list(LEADS))
def test_source_answers_in_the_shape_its_adapter_reads(source: str, tmp_path: Path) -> None:
    BOOTSTRAPS.clear()
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    fetcher = Fetcher(sink=store)
    try:
        lead = normalize_lead(*LEADS[source])
        store.add_lead(lead, case_id="live")
        collector = Collector(catalog=_catalog(), store=store, records=RecordStore(tmp_path / "records"),
                              fetcher=fetcher)
        result = collector.collect(source, lead.id)
    finally:
        fetcher.close()
        store.close()
    assert result.outcome == "ok", f"{source} answered with no records for {lead.value}"
    assert result.records >= 1
