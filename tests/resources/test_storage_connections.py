"""A run worker keeps its Dagster storage connections open for the run; a sensor's resources do not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dagster import AssetMaterialization, DagsterInstance, asset, build_resources, materialize
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from resources.fleet import FleetResource
from resources.storage_connections import hold_connections_for_the_run
from tests.conftest import POSTGRES_URL, require_postgres

pytestmark = pytest.mark.postgres


def _admin(sql: str, **params: object) -> list[tuple]:
    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            result = conn.execute(text(sql), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _backends(db: str) -> int:
    """Connections to `db` open on the server now (other than the one asking)."""
    return _admin("SELECT count(*) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()", db=db)[0][0]


@pytest.fixture
def pg_instance(tmp_path: Path) -> Iterator[tuple[DagsterInstance, str]]:
    """A Dagster instance whose runs, events and schedules are in a fresh Postgres database."""
    require_postgres()
    db = f"dagster_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{db}"')
    url = make_url(POSTGRES_URL).set(database=db).render_as_string(hide_password=False)
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"postgres": {"postgres_url": url}}}))
    instance = DagsterInstance.from_config(str(tmp_path))
    try:
        yield instance, db
    finally:
        instance.dispose()
        _admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


@asset
def uses_the_fleet(fleet: FleetResource) -> None:
    fleet.settings()


def test_a_run_leaves_its_storage_connection_open_between_writes(pg_instance, sandbox_env) -> None:
    instance, db = pg_instance
    assert _backends(db) == 0  # Dagster's default: a connection per write, none held between them
    assert materialize([uses_the_fleet], instance=instance, resources={"fleet": FleetResource()}).success
    held = _backends(db)
    assert held >= 1
    instance.report_runless_asset_event(AssetMaterialization("after_the_run"))
    assert _backends(db) == held  # the next write went over a held connection, not a new one


def test_resources_built_outside_a_run_leave_the_instance_as_it_was(pg_instance, sandbox_env) -> None:
    instance, db = pg_instance
    with build_resources({"fleet": FleetResource()}, instance=instance) as resources:
        resources.fleet.settings()
    instance.report_runless_asset_event(AssetMaterialization("from_a_sensor"))
    assert _backends(db) == 0


def test_switching_an_instance_twice_does_it_once(pg_instance) -> None:
    instance, _ = pg_instance
    assert hold_connections_for_the_run(instance) is True
    assert hold_connections_for_the_run(instance) is False
    assert hold_connections_for_the_run(None) is False


def test_after_the_server_drops_the_held_connection_at_most_one_write_fails(pg_instance, sandbox_env) -> None:
    instance, db = pg_instance
    assert materialize([uses_the_fleet], instance=instance, resources={"fleet": FleetResource()}).success
    _admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()",
           db=db)
    failures = 0
    for attempt in range(3):
        try:
            instance.report_runless_asset_event(AssetMaterialization(f"after_restart_{attempt}"))
        except Exception:  # the dead connection's one error, as a write during the outage would fail
            failures += 1
    assert failures <= 1
    assert instance.get_latest_materialization_event(AssetMaterialization("after_restart_2").asset_key) is not None
