"""The composition root builds every collecting process's engine the same way, installs log
redaction before the first request, and closes only what it opened itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from investigations.composition import open_engine
from investigations.config import Settings
from investigations.intake.leads import normalize_lead
from investigations.store import StateStore
from resources.fleet import FleetResource
from resources.identities import IdentityPoolResource

ROOT = Path(__file__).resolve().parents[2]
IDENTITIES = """
tiers: [datacenter]
identities:
  - {id: dc1_a, range: dc1, tier: datacenter}
  - {id: dc1_b, range: dc1, tier: datacenter}
"""


def _settings(tmp_path: Path, *, identities: bool) -> Settings:
    env = {"INVESTIGATIONS_DATA_DIR": str(tmp_path / "data"), "INVESTIGATIONS_SOURCES": str(ROOT / "sources.yaml")}
    if identities:
        path = tmp_path / "identities.yaml"
        path.write_text(IDENTITIES)
        env["INVESTIGATIONS_IDENTITIES"] = str(path)
    return Settings.from_env(env)


def test_without_an_identities_file_requests_go_out_directly(tmp_path: Path) -> None:
    engine = open_engine(_settings(tmp_path, identities=False))
    try:
        assert engine.pool is None and engine.cookies is None and engine.fetcher.pool is None
        assert engine.fetcher.lanes is engine.lanes
        assert {spec.name for spec in engine.catalog.sources} >= {"robust", "quiet"}
    finally:
        engine.close()


def test_with_an_identities_file_the_fetcher_leases_from_the_synced_pool(tmp_path: Path) -> None:
    engine = open_engine(_settings(tmp_path, identities=True))
    try:
        assert engine.fetcher.pool is engine.pool and engine.pool is not None
        lease = engine.pool.acquire("robust", holder="test", ttl_s=30)
        assert lease is not None and lease.identity_id in {"dc1_a", "dc1_b"}
        engine.pool.release(lease)
    finally:
        engine.close()


def test_a_collector_of_the_engine_stores_into_the_engine_s_stores(tmp_path: Path, sandbox, monkeypatch) -> None:
    sandbox.app_state.reset()
    monkeypatch.setenv("INVESTIGATIONS_SANDBOX_URL", sandbox.url)
    engine = open_engine(_settings(tmp_path, identities=False))
    try:
        lead = normalize_lead("domain", "example.com")
        engine.store.add_lead(lead)
        result = engine.collector().collect("robust", lead.id)
        assert result.outcome == "ok" and Path(result.path).is_relative_to(engine.records.root)
        assert engine.store.collection("robust", lead.id) is not None
    finally:
        engine.close()


def test_close_leaves_a_store_it_was_handed_open(tmp_path: Path) -> None:
    settings = _settings(tmp_path, identities=False)
    store = StateStore.from_url(settings.database_url)
    try:
        open_engine(settings, store=store).close()
        assert store.queue_depths() == {}  # still usable
    finally:
        store.close()


def test_importing_the_fetcher_installs_nothing_and_opening_an_engine_installs_redaction(tmp_path: Path) -> None:
    # A fresh interpreter: in this one, earlier tests may have installed it already.
    code = (
        "import logging, sys\n"
        "import investigations.collection.fetcher\n"
        "print(logging.getLogRecordFactory() is logging.LogRecord)\n"
        "from investigations.composition import open_engine\n"
        "from investigations.config import Settings\n"
        "from investigations.net.redaction import register_secret\n"
        f"open_engine(Settings.from_env({{'INVESTIGATIONS_DATA_DIR': {str(tmp_path / 'd')!r}}})).close()\n"
        "register_secret('s3cr3t-token-value')\n"
        "record = logging.getLogger('httpx').makeRecord('httpx', logging.INFO, 'x.py', 1,\n"
        "    'GET https://api.example/?key=%s', ('s3cr3t-token-value',), None)\n"
        "print(record.getMessage())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    untouched, message = done.stdout.split("\n")[:2]
    assert untouched == "True"
    assert "s3cr3t-token-value" not in message and "***" in message


def test_a_run_with_identities_opens_one_state_store(tmp_path: Path, sandbox_env: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from dagster import DagsterInstance, materialize

    from assets.sources import build_source_asset
    from investigations.sources.catalog import load_catalog

    settings = _settings(tmp_path, identities=True)
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(settings.data_dir))
    lead = normalize_lead("domain", "example.com")
    setup = StateStore.from_url(settings.database_url)
    setup.add_lead(lead)
    setup.close()
    opened: list[str] = []
    real_init = StateStore.__init__

    def counting_init(self: StateStore, *args: object, **kwargs: object) -> None:
        opened.append(str(args[0]) if args else "")
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(StateStore, "__init__", counting_init)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("leads", [lead.id])
    proxies = IdentityPoolResource(identities_path=str(settings.identities_path))
    result = materialize([build_source_asset(load_catalog(settings.sources_path).get("robust"))],
                         partition_key=lead.id, instance=instance,
                         resources={"fleet": FleetResource(identities=proxies), "identities": proxies})
    assert result.success
    (mat,) = result.asset_materializations_for_node("sources__robust")
    assert mat.metadata["identity_ids"].value[0] in {"dc1_a", "dc1_b"}  # it did go out through the pool
    assert len(opened) == 1, opened
