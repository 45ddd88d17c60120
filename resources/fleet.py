"""The engine handed to Dagster: state store, record store and fetcher behind one resource."""

from __future__ import annotations

import os
import random

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from investigations.catalog import load_catalog
from investigations.collect import CollectionResult, Collector
from investigations.config import Settings
from investigations.fetcher import Fetcher
from investigations.pacing import Circuits, GapSampler, RateLanes
from investigations.records import RecordStore
from investigations.specs import SourceCatalog
from investigations.store import StateStore


class FleetResource(ConfigurableResource):
    """Where the fleet keeps its state and records. Unset fields come from `INVESTIGATIONS_*`.

    Opened once per run (store connections, one HTTP client) and closed at teardown, so a run
    never leaks connections whatever its assets do.
    """

    database_url: str | None = None
    data_dir: str | None = None
    sources_path: str | None = None

    _store: StateStore | None = PrivateAttr(default=None)
    _fetcher: Fetcher | None = PrivateAttr(default=None)

    def settings(self) -> Settings:
        env = dict(os.environ)
        for name, value in (
            ("INVESTIGATIONS_DATABASE_URL", self.database_url),
            ("INVESTIGATIONS_DATA_DIR", self.data_dir),
            ("INVESTIGATIONS_SOURCES", self.sources_path),
        ):
            if value:
                env[name] = value
        return Settings.from_env(env)

    @property
    def catalog(self) -> SourceCatalog:
        return load_catalog(self.settings().sources_path)

    @property
    def store(self) -> StateStore:
        if self._store is None:
            self._store = StateStore.from_url(self.settings().database_url)
        return self._store

    @property
    def records(self) -> RecordStore:
        return RecordStore(self.settings().records_dir)

    def collector(self) -> Collector:
        """The engine's collector, pacing every request through the shared rate lanes and circuits."""
        if self._fetcher is None:
            lanes = RateLanes(self.store, sampler=GapSampler(random.Random()))
            self._fetcher = Fetcher(sink=self.store, lanes=lanes)
        return Collector(catalog=self.catalog, store=self.store, records=self.records, fetcher=self._fetcher,
                         circuits=Circuits(self.store))

    def collect(self, source: str, lead_id: str, *, run_id: str | None = None) -> CollectionResult:
        """Collect one (source, lead) partition; see investigations.collect.Collector.collect."""
        return self.collector().collect(source, lead_id, run_id=run_id)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None
        if self._store is not None:
            self._store.close()
            self._store = None
