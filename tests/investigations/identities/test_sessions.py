"""Cookie jars per identity, kept in the state store across runs and merged, not clobbered."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from investigations.identities import CookieStore
from investigations.store import StateStore
from tests.fakes import FakeClock, runs_without_the_write_lock

NOW = 1_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


def jar(*cookies: tuple[str, str, str]) -> httpx.Cookies:
    out = httpx.Cookies()
    for name, value, domain in cookies:
        out.set(name, value, domain=domain, path="/")
    return out


def as_set(cookies: httpx.Cookies) -> set[tuple[str, str, str, str]]:
    return {(c.name, c.value or "", c.domain, c.path) for c in cookies.jar}


def test_cookies_saved_by_one_run_are_loaded_by_the_next(store: StateStore, clock: FakeClock) -> None:
    CookieStore(store, clock=clock).save("dc1_a", jar(("sid", "abc", "example.com"), ("pref", "dark", "example.com")))
    loaded = CookieStore(store, clock=clock).load("dc1_a")
    assert as_set(loaded) == {("sid", "abc", "example.com", "/"), ("pref", "dark", "example.com", "/")}


def test_loaded_cookies_are_sent_by_httpx(store: StateStore, clock: FakeClock) -> None:
    CookieStore(store, clock=clock).save("dc1_a", jar(("sid", "abc", "example.com")))
    with httpx.Client(cookies=CookieStore(store, clock=clock).load("dc1_a")) as client:
        request = client.build_request("GET", "http://example.com/page")
    assert request.headers["cookie"] == "sid=abc"


def test_each_identity_keeps_its_own_jar(store: StateStore, clock: FakeClock) -> None:
    cookies = CookieStore(store, clock=clock)
    cookies.save("dc1_a", jar(("sid", "a", "example.com")))
    cookies.save("dc1_b", jar(("sid", "b", "example.com")))
    assert as_set(cookies.load("dc1_b")) == {("sid", "b", "example.com", "/")}
    assert as_set(cookies.load("never_used")) == set()


def test_two_runs_saving_the_same_identity_merge_their_cookies(store: StateStore, clock: FakeClock) -> None:
    run_1, run_2 = CookieStore(store, clock=clock), CookieStore(store, clock=clock)
    run_1.save("dc1_a", jar(("sid", "one", "a.example"), ("shared", "old", "b.example")))
    run_2.save("dc1_a", jar(("token", "two", "b.example"), ("shared", "new", "b.example")))
    assert as_set(CookieStore(store, clock=clock).load("dc1_a")) == {
        ("sid", "one", "a.example", "/"),
        ("token", "two", "b.example", "/"),
        ("shared", "new", "b.example", "/"),  # the same cookie: the later save wins
    }


def test_a_cookie_the_site_deleted_during_the_run_is_deleted_from_the_store(store: StateStore, clock: FakeClock) -> None:
    cookies = CookieStore(store, clock=clock)
    cookies.save("dc1_a", jar(("sid", "abc", "example.com"), ("tracking", "x", "example.com")))
    base = cookies.load("dc1_a")
    during = cookies.load("dc1_a")
    during.delete("tracking", domain="example.com", path="/")
    CookieStore(store, clock=clock).save("dc1_a", jar(("other_run", "y", "example.org")))  # meanwhile
    cookies.save("dc1_a", during, base=base)
    assert as_set(cookies.load("dc1_a")) == {("sid", "abc", "example.com", "/"), ("other_run", "y", "example.org", "/")}


def test_a_jar_the_run_left_as_it_loaded_it_is_not_written_and_loading_waits_for_no_writer(
    sqlite_store: StateStore, clock: FakeClock
) -> None:
    """Every collection opens a session (a load) and closes it (a save): most set no cookie, and
    neither their load nor their save waits for SQLite's one writer."""
    store = CookieStore(sqlite_store, clock=clock)
    store.save("id1", jar(("sid", "1", "a.example")))
    loaded: list[httpx.Cookies] = []
    assert runs_without_the_write_lock(sqlite_store, lambda: loaded.append(store.load("id1")))
    base = loaded[0]
    assert runs_without_the_write_lock(sqlite_store, lambda: store.save("id1", base, base=base))
    changed = jar(("sid", "2", "a.example"))
    assert not runs_without_the_write_lock(sqlite_store, lambda: store.save("id1", changed, base=base), wait_s=1.0)
    assert as_set(store.load("id1")) == {("sid", "2", "a.example", "/")}


def test_expired_cookies_are_not_loaded(store: StateStore, clock: FakeClock) -> None:
    clock.now = time.time()  # the cookie jar dates Max-Age from the real clock
    response = httpx.Response(
        200,
        headers=[("set-cookie", "short=1; Path=/; Max-Age=60"), ("set-cookie", "session=2; Path=/")],
        request=httpx.Request("GET", "http://example.com/"),
    )
    received = httpx.Cookies()
    received.extract_cookies(response)
    cookies = CookieStore(store, clock=clock)
    cookies.save("dc1_a", received)
    assert {c.name for c in cookies.load("dc1_a").jar} == {"short", "session"}
    clock.now += 61
    assert {c.name for c in cookies.load("dc1_a").jar} == {"session"}  # a session cookie lasts across runs


def test_saves_racing_from_eight_threads_lose_no_cookie(store: StateStore, clock: FakeClock) -> None:
    start = threading.Barrier(8)

    def run(n: int) -> None:
        start.wait()
        CookieStore(store, clock=clock).save("fresh", jar((f"c{n}", str(n), "example.com")))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {c.name for c in CookieStore(store, clock=clock).load("fresh").jar} == {f"c{n}" for n in range(8)}
