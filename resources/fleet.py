"""The engine handed to Dagster: state store, record store, identity pool and fetcher behind one resource."""

from __future__ import annotations

import threading

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from investigations.collection.collect import CollectionResult, Collector
from investigations.composition import Engine, open_engine
from investigations.config import Settings
from investigations.evidence.records import RecordStore
from investigations.sources.catalog import load_catalog
from investigations.sources.specs import SourceCatalog
from investigations.store import StateStore
from resources.dagster_internals import hold_connections_for_the_run
from resources.identities import IdentityPoolResource


class FleetResource(ConfigurableResource):
    """Where the fleet keeps its state and records, and what its requests go out as. Unset fields
    come from `INVESTIGATIONS_*` (`_DATABASE_URL`, `_DATA_DIR`, `_SOURCES`, `_IDENTITIES`).

    Opened once per run (store connections, the identity pool, one HTTP client per identity) and
    closed at teardown, so a run never leaks connections whatever its assets do. With an identities
    file every collection leases an identity from the pool shared through the state store; without
    one, requests go out directly as the `direct` identity, as they always did.
    """

    database_url: str | None = None
    data_dir: str | None = None
    sources_path: str | None = None
    identities_path: str | None = None
    # The proxy resource the requests go out through (Definitions registers it as `identities`
    # and hands it here): its identities file, and the run's leases given back at the end.
    identities: IdentityPoolResource | None = None

    _store: StateStore | None = PrivateAttr(default=None)
    _engine: Engine | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)
    # Batch runs collect several leads at once in threads: the first of them opens the engine.
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if context.run is not None:
            # A run worker writes two events per lead: keep its storage connections open for the run.
            hold_connections_for_the_run(context.instance)

    def settings(self) -> Settings:
        """The fleet's settings, read once per run (every collection of a batch asks for them): this
        resource's fields and the proxy resource's identities file over `INVESTIGATIONS_*`."""
        if self._settings is None:
            self._settings = Settings.overlaid({
                "INVESTIGATIONS_DATABASE_URL": self.database_url,
                "INVESTIGATIONS_DATA_DIR": self.data_dir,
                "INVESTIGATIONS_SOURCES": self.sources_path,
                "INVESTIGATIONS_IDENTITIES": self.identities_path or (self.identities.identities_path
                                                                      if self.identities else None),
            })
        return self._settings

    @property
    def catalog(self) -> SourceCatalog:
        return load_catalog(self.settings().sources_path)

    @property
    def store(self) -> StateStore:
        """The run's one state store, which its engine uses too (a sensor's tick, needing only the
        store, opens no engine)."""
        with self._lock:
            if self._store is None:
                self._store = StateStore.from_url(self.settings().database_url)
            return self._store

    @property
    def records(self) -> RecordStore:
        return RecordStore(self.settings().records_dir)

    def engine(self) -> Engine:
        """The run's engine (see investigations.composition), opened on first use and closed at
        teardown: one state store, every request paced through the shared rate lanes and circuits,
        sent as an identity leased from the pool (or directly, without an identities file). The
        identities file is read per run: an edit (or a rotated password in the environment) reaches
        the next run, and a broken file fails here, naming the identity and key."""
        store = self.store
        with self._lock:
            if self._engine is None:
                self._engine = open_engine(self.settings(), store=store)
            return self._engine

    def collector(self) -> Collector:
        """The engine's collector, over the sources file as it is now."""
        return self.engine().collector(self.catalog)

    def collect(self, source: str, lead_id: str, *, run_id: str | None = None,
                background: bool = False) -> CollectionResult:
        """Collect one (source, lead) partition; see investigations.collection.collect.Collector.collect."""
        return self.collector().collect(source, lead_id, run_id=run_id, background=background)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        with self._lock:
            engine, store = self._engine, self._store
            self._engine = self._store = self._settings = None
        try:
            if engine is not None:
                try:
                    if engine.pool is not None and context.run is not None:
                        (self.identities or IdentityPoolResource()).give_back(engine.pool, run_id=context.run.run_id)
                finally:
                    engine.close()  # its HTTP clients and the pool it opened; the store is ours
        finally:
            if store is not None:
                store.close()
