"""A run's work: its handover's leads as they finish, and fresh leads joined to it while it is open."""

from __future__ import annotations

import threading
import time

import pytest

from investigations.collection.runwork import RunWork
from investigations.store import StateStore

KEY = "robust:batch:open"


@pytest.fixture
def store(tmp_path):
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    yield store
    store.close()


def _handed_over(store: StateStore, leads: list[str], *, key: str = KEY, origin: str = "inbox:1") -> list[int]:
    store.enqueue([("robust", lead) for lead in leads], origin=origin, priority_class="interactive", case_id="c1")
    rows = store.dispatch("robust", limit=len(leads))
    store.assign_handover([row.id for row in rows], handover_key=key)
    return [row.id for row in rows]


def _join(store: StateStore, lead: str, *, origin: str) -> bool:
    store.enqueue([("robust", lead)], origin=origin, priority_class="interactive", case_id="c2")
    rows = store.dispatch("robust", limit=1)
    return store.join_collector(KEY, [row.id for row in rows], now_s=time.time())


def _work(store, leads, rows, collect, **options) -> RunWork[str]:
    return RunWork(store, source="robust", handover_key=KEY, leads=leads, taken_rows=rows, collect=collect,
                   concurrency=1, **options)


def test_a_run_closed_to_joins_collects_its_leads_and_ends(store) -> None:
    rows = _handed_over(store, ["a", "b", "c"])
    work = _work(store, ["a", "b", "c"], rows, collect=lambda lead: f"stored {lead}")
    assert list(work.outcomes()) == [("a", "stored a"), ("b", "stored b"), ("c", "stored c")]
    assert store.open_collectors(now_s=time.time()) == {}  # never open: a background or UI run


def test_a_fresh_lead_joined_to_an_open_run_goes_ahead_of_the_leads_still_waiting(store) -> None:
    rows = _handed_over(store, ["a", "b", "c"])
    joined: list[list[str]] = []

    def collect(lead: str) -> str:
        if lead == "a":
            assert store.open_collectors(now_s=time.time()) == {"robust": [(KEY, 3)]}
            assert _join(store, "fresh", origin="inbox:2")
            time.sleep(0.4)  # the run looks at its handover meanwhile
        return lead

    work = _work(store, ["a", "b", "c"], rows, collect, open_to_joins=True, linger_s=0.0,
                 on_join=lambda found: joined.append([row.lead_id for row in found]))
    assert [lead for lead, _ in work.outcomes()] == ["a", "fresh", "b", "c"]
    assert joined == [["fresh"]]


def test_an_open_run_lingers_for_the_next_fresh_lead_then_closes(store) -> None:
    rows = _handed_over(store, ["a"])
    timer = threading.Timer(0.5, lambda: _join(store, "later", origin="inbox:2"))
    timer.start()
    started = time.monotonic()
    outcomes = list(_work(store, ["a"], rows, collect=str, open_to_joins=True, linger_s=1.5).outcomes())
    timer.join()
    assert [lead for lead, _ in outcomes] == ["a", "later"]  # it arrived after "a" was done
    assert time.monotonic() - started >= 1.5  # then it waited its linger for more, and closed
    assert store.open_collectors(now_s=time.time()) == {}
    assert not _join(store, "too-late", origin="inbox:3")  # a closed run is joined no more


def test_a_run_that_closes_still_takes_what_was_joined_before_it_closed(store) -> None:
    rows = _handed_over(store, ["a"])

    def collect(lead: str) -> str:
        if lead == "a":
            assert _join(store, "just-in-time", origin="inbox:2")  # joined, then the run closes at once
        return lead

    work = _work(store, ["a"], rows, collect, open_to_joins=True, linger_s=0.0)
    assert [lead for lead, _ in work.outcomes()] == ["a", "just-in-time"]


def test_a_run_that_stops_renewing_is_joined_no_more(store) -> None:
    _handed_over(store, ["a"])
    store.open_collector(KEY, "robust", until_s=time.time() - 1)  # its run died: the row lapsed
    assert store.open_collectors(now_s=time.time()) == {}
    assert not _join(store, "fresh", origin="inbox:2")
    assert store.handover_leads(KEY) == ["a"]  # the fresh lead was not recorded under the dead run


def test_a_failing_collection_closes_the_run_to_joins(store) -> None:
    rows = _handed_over(store, ["a"])

    def collect(lead: str) -> str:
        raise RuntimeError("worker trouble")

    with pytest.raises(RuntimeError, match="worker trouble"):
        list(_work(store, ["a"], rows, collect, open_to_joins=True).outcomes())
    assert store.open_collectors(now_s=time.time()) == {}


def test_a_run_says_it_is_idle_with_the_outcome_that_left_nothing_in_flight_or_waiting(store) -> None:
    rows = _handed_over(store, ["a", "b", "c"])
    work = _work(store, ["a", "b", "c"], rows, collect=str, open_to_joins=True, linger_s=0.5)
    idle = [(lead, work.idle) for lead, _ in work.outcomes()]
    # Idle at the last lead, before the open run's linger: what waits for a group goes out then.
    assert idle == [("a", False), ("b", False), ("c", True)]


def test_a_freed_thread_starts_its_next_lead_before_the_outcome_goes_back(store) -> None:
    # The caller's work on an outcome (Dagster storing its events) must not hold the thread idle.
    rows = _handed_over(store, ["a", "b"])
    started = {lead: threading.Event() for lead in ("a", "b")}

    def collect(lead: str) -> str:
        started[lead].set()
        return lead

    outcomes = _work(store, ["a", "b"], rows, collect).outcomes()
    assert next(outcomes) == ("a", "a")
    # The generator is paused at a's outcome: b was already handed to the freed thread.
    assert started["b"].wait(timeout=5.0)
    assert list(outcomes) == [("b", "b")]
