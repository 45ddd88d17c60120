"""The fault suite's own Postgres server: a crash cuts every connection, a restart recovers what was committed."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from bench.pgserver import PostgresServer, find_bindir

pytestmark = pytest.mark.skipif(find_bindir() is None, reason="PostgreSQL's server programs are not installed")


def test_a_crashed_server_refuses_connections_and_comes_back_with_its_committed_rows() -> None:
    with PostgresServer() as server:
        engine = create_engine(server.url, pool_pre_ping=True)
        try:
            with engine.begin() as conn:
                conn.execute(text("CREATE TABLE kept (n integer)"))
                conn.execute(text("INSERT INTO kept VALUES (1), (2)"))
            server.crash()
            with pytest.raises(OperationalError):
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
            server.start()
            with engine.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM kept")).scalar_one() == 2
        finally:
            engine.dispose()
    assert not server.dir.exists()
