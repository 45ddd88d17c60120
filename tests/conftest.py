"""Small worlds for the tests: a sandbox web on loopback, a state store on SQLite or Postgres.

Postgres tests need the server at INVESTIGATIONS_TEST_POSTGRES_URL (default: the local one). Under
CI=true a missing server fails them; elsewhere they are skipped with the reason printed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from investigations.sandbox import SandboxConfig, start_in_thread
from investigations.store import StateStore

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = os.environ.get("INVESTIGATIONS_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test")

# Tests must never pick up an operator's settings or a proxy from the environment.
for _name in [n for n in os.environ if n.startswith("INVESTIGATIONS_") and n != "INVESTIGATIONS_TEST_POSTGRES_URL"]:
    del os.environ[_name]
for _name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    os.environ.pop(_name, None)


def _postgres_unreachable() -> str | None:
    try:
        engine = create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:  # any failure to connect means "no server here"
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {type(exc).__name__}"


_PG_PROBLEM: str | None = None
_PG_CHECKED = False


def require_postgres() -> None:
    """Skip (or, under CI, fail) when the Postgres server is not there."""
    global _PG_PROBLEM, _PG_CHECKED
    if not _PG_CHECKED:
        _PG_PROBLEM, _PG_CHECKED = _postgres_unreachable(), True
    if _PG_PROBLEM:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{_PG_PROBLEM} (required under CI=true)")
        pytest.skip(_PG_PROBLEM)


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh Postgres schema for one test, dropped afterwards."""
    require_postgres()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield schema
    engine = create_engine(POSTGRES_URL)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """(url, schema) of an empty state store database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}", None
    schema = request.getfixturevalue("pg_schema")
    return POSTGRES_URL, schema


@pytest.fixture
def store(database: tuple[str, str | None]) -> Iterator[StateStore]:
    url, schema = database
    state = StateStore.from_url(url, schema=schema)
    yield state
    state.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    yield state
    state.close()


@pytest.fixture(scope="session")
def sandbox() -> Iterator:
    """The sandbox web on a free loopback port, shared by the session (stalls kept short)."""
    handle = start_in_thread(SandboxConfig(flaky_stall_s=0.5, slow_delay_s=(0.05, 0.1)))
    yield handle
    handle.stop()


@pytest.fixture
def sandbox_env(sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the fleet at the sandbox and a fresh data dir (SQLite state); return the data dir."""
    sandbox.app_state.reset()
    data_dir = tmp_path / "data"
    monkeypatch.setenv("INVESTIGATIONS_SANDBOX_URL", sandbox.url)
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(data_dir))
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(ROOT / "sources.yaml"))
    return data_dir
