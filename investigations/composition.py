"""The composition root: the one place the fleet's engine objects are built from its settings.

Every process that collects (a Dagster run worker through `FleetResource`, the benches' engine
processes) opens its engine here, so they all send the same way: one state store, the rate lanes
and circuits in it, the identity pool and cookie jars when an identities file is set, one fetcher
that paces on those lanes and reports to that pool, and the record, capture and bootstrap stores
in the data dir. Log redaction is installed here too, before the first request can be logged:
whoever sends requests built them here.

    engine = open_engine(Settings.from_env())
    try:
        engine.collector().collect("robust", lead_id)
    finally:
        engine.close()
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from investigations.adapters import TtlCache
from investigations.collection.collect import Collector
from investigations.collection.fetcher import Fetcher
from investigations.config import Settings
from investigations.evidence.captures import EvidenceStore
from investigations.evidence.records import RecordStore
from investigations.identities import CookieStore, HealthPolicy, IdentityPool, load_identities
from investigations.net.redaction import install_log_redaction
from investigations.pacing import Circuits, GapSampler, RateLanes
from investigations.sources.catalog import load_catalog
from investigations.sources.specs import SourceCatalog
from investigations.store import StateStore


@dataclass
class Engine:
    """The engine objects of one process, built by `open_engine`; `close()` closes what it opened."""

    settings: Settings
    catalog: SourceCatalog
    store: StateStore
    records: RecordStore
    lanes: RateLanes
    circuits: Circuits
    fetcher: Fetcher
    pool: IdentityPool | None
    cookies: CookieStore | None
    cache: TtlCache
    evidence: EvidenceStore
    _owned: list[StateStore | IdentityPool] = field(default_factory=list, repr=False)

    def collector(self, catalog: SourceCatalog | None = None) -> Collector:
        """A collector over this engine (`catalog` to collect with a newer sources file, as a
        long-lived process would after an edit)."""
        return Collector(catalog=catalog or self.catalog, store=self.store, records=self.records,
                         fetcher=self.fetcher, circuits=self.circuits, cache=self.cache, evidence=self.evidence)

    def close(self) -> None:
        """Close the fetcher's HTTP clients, then the pool and store this engine opened itself
        (those handed to `open_engine` belong to whoever handed them)."""
        self.fetcher.close()
        for owned in reversed(self._owned):
            owned.close()
        self._owned.clear()


def open_engine(
    settings: Settings,
    *,
    store: StateStore | None = None,
    rng: random.Random | None = None,
) -> Engine:
    """Build the engine from `settings`: the one place a process builds its state store (unless
    handed the one it has already opened, which `Engine.close` then leaves open) and its identity
    pool. Without an identities file, requests go out directly as the `direct` identity. `rng`
    seeds the lanes' timing and the pool's choices (the benches pass one so their runs repeat)."""
    install_log_redaction()
    owned: list[StateStore | IdentityPool] = []
    if store is None:
        store = StateStore.from_url(settings.database_url)
        owned.append(store)
    pool = cookies = None
    if settings.identities_path is not None:
        # A broken identities file fails here, naming the identity and key.
        pool = IdentityPool(store, load_identities(settings.identities_path), policy=HealthPolicy(),
                            rng=rng or random.Random())
        pool.sync()
        owned.append(pool)
        cookies = CookieStore(store)
    lanes = RateLanes(store, sampler=GapSampler(rng or random.Random()))
    return Engine(
        settings=settings,
        catalog=load_catalog(settings.sources_path),
        store=store,
        records=RecordStore(settings.records_dir),
        lanes=lanes,
        circuits=Circuits(store),
        fetcher=Fetcher(sink=store, lanes=lanes, pool=pool, cookies=cookies),
        pool=pool,
        cookies=cookies,
        # Bootstrap files (RDAP's, Common Crawl's collection list) are kept in the data dir, so
        # one-lead runs do not each ask for them again; captures live beside the records.
        cache=TtlCache(settings.data_dir / "cache"),
        evidence=EvidenceStore(settings.data_dir),
        _owned=owned,
    )
