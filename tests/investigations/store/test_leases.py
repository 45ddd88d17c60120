"""The lease hot path on Postgres: a server restart costs no caller an error."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import func, literal, select

from bench.pgserver import PostgresServer, find_bindir
from investigations.store import StateStore
from investigations.store.leases import LeaseHotPath

pytestmark = pytest.mark.skipif(find_bindir() is None, reason="PostgreSQL's server programs are not installed")


def test_after_a_postgres_restart_the_next_statement_runs_on_a_new_connection() -> None:
    with PostgresServer() as server:
        store = StateStore.from_url(server.url)
        slow = select(literal(1)).select_from(func.pg_sleep(0.3))  # long enough for four to overlap
        hot = LeaseHotPath(store, {"one": slow}, write_lock=threading.Lock(), connections=4)
        try:
            callers = [threading.Thread(target=hot.run, args=("one", {})) for _ in range(4)]
            for caller in callers:
                caller.start()
            for caller in callers:
                caller.join()
            server.crash()  # the four idle connections die with it
            server.start()
            assert hot.run("one", {}) == [("1",)]
        finally:
            hot.close()
            store.close()
