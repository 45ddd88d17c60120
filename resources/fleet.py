"""The engine handed to Dagster: state store, record store, identity pool and fetcher behind one resource."""

from __future__ import annotations

import os
import threading

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from investigations.catalog import load_catalog
from investigations.collect import CollectionResult, Collector
from investigations.composition import Engine, open_engine
from investigations.config import Settings
from investigations.records import RecordStore
from investigations.specs import SourceCatalog
from investigations.store import StateStore
from resources.identities import IdentityPoolResource
from resources.storage_connections import hold_connections_for_the_run


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
    # and hands it here); unset, the fleet opens one of its own on the same settings.
    identities: IdentityPoolResource | None = None

    _store: StateStore | None = PrivateAttr(default=None)
    _engine: Engine | None = PrivateAttr(default=None)
    _own_identities: IdentityPoolResource | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)
    # Batch runs collect several leads at once in threads: the first of them opens the engine.
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        if context.run is not None:
            # A run worker writes two events per lead: keep its storage connections open for the run.
            hold_connections_for_the_run(context.instance)

    def settings(self) -> Settings:
        """The fleet's settings, read once per run (every collection of a batch asks for them)."""
        if self._settings is None:
            self._settings = self._read_settings()
        return self._settings

    def _read_settings(self) -> Settings:
        env = dict(os.environ)
        for name, value in (
            ("INVESTIGATIONS_DATABASE_URL", self.database_url),
            ("INVESTIGATIONS_DATA_DIR", self.data_dir),
            ("INVESTIGATIONS_SOURCES", self.sources_path),
            ("INVESTIGATIONS_IDENTITIES", self.identities_path),
        ):
            if value:
                env[name] = value
        return Settings.from_env(env)

    @property
    def catalog(self) -> SourceCatalog:
        return load_catalog(self.settings().sources_path)

    @property
    def store(self) -> StateStore:
        with self._lock:
            if self._store is None:
                self._store = StateStore.from_url(self.settings().database_url)
            return self._store

    @property
    def records(self) -> RecordStore:
        return RecordStore(self.settings().records_dir)

    def engine(self) -> Engine:
        """The run's engine (see investigations.composition), opened on first use and closed at
        teardown: every request paced through the shared rate lanes and circuits, sent as an
        identity leased through the proxy resource (or directly, without an identities file)."""
        store = self.store
        with self._lock:
            if self._engine is None:
                pool = cookies = None
                proxies = self._proxy_resource()
                if proxies.settings().identities_path is not None:
                    # Opened per run: an edit of the file (or a rotated password in the environment)
                    # reaches the next run. A broken file fails here, naming the identity and key.
                    pool, cookies = proxies.pool, proxies.cookies
                self._engine = open_engine(self.settings(), store=store, pool=pool, cookies=cookies)
            return self._engine

    def collector(self) -> Collector:
        """The engine's collector, over the sources file as it is now."""
        return self.engine().collector(self.catalog)

    def _proxy_resource(self) -> IdentityPoolResource:
        """The identity pool's resource: the one Definitions handed over, else one of our own."""
        if self.identities is not None:
            return self.identities
        if self._own_identities is None:
            settings = self.settings()
            path = settings.identities_path
            self._own_identities = IdentityPoolResource(identities_path=str(path) if path else None,
                                                        database_url=settings.database_url)
        return self._own_identities

    def collect(self, source: str, lead_id: str, *, run_id: str | None = None,
                background: bool = False) -> CollectionResult:
        """Collect one (source, lead) partition; see investigations.collect.Collector.collect."""
        return self.collector().collect(source, lead_id, run_id=run_id, background=background)

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        with self._lock:
            engine, own, store = self._engine, self._own_identities, self._store
            self._engine = self._own_identities = self._store = None
            self._settings = None
        if engine is not None:
            engine.close()  # its HTTP clients; the store and pool it was handed are closed below
        if own is not None:
            # Leases are released by each collection's `finally`; this closes the pool's
            # connections. A pool handed over by Definitions is closed by its own teardown.
            own.teardown_after_execution(context)
        if store is not None:
            store.close()
