"""`investigations demo-case` against a real intake: sent twice, it is stored and queued once; with
no intake answering, it says so in one line."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from investigations.cli import main
from investigations.demo.case import DEMO_LEADS
from investigations.intake.app import create_intake_app, server_config
from investigations.scheduling.dispatch import ingest
from investigations.sources.specs import load_sources
from investigations.store import StateStore

SOURCES = Path(__file__).resolve().parents[2] / "sources.yaml"
SECRET = "whsec_" + base64.b64encode(b"demo-case-test-secret-0123456789").decode()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    yield state
    state.close()


@pytest.fixture
def intake_url(store: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The intake, served by uvicorn on a loopback port in a thread, signing secret and all."""
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("INVESTIGATIONS_WEBHOOK_SECRET", SECRET)
    app = create_intake_app(store=store, catalog=load_sources(SOURCES), secret=SECRET)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=sock.getsockname()[1]))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the intake did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def test_the_demo_case_sent_twice_is_stored_and_queued_once(store, intake_url, capsys) -> None:
    catalog = load_sources(SOURCES)
    assert main(["demo-case", "--intake-url", intake_url]) == 0
    assert f"{len(DEMO_LEADS)} new lead(s)" in capsys.readouterr().out
    first = store.inbox_after(0, limit=1000)
    queued, _ = ingest(store, first, catalog)
    assert len(first) == len(DEMO_LEADS) and queued > len(DEMO_LEADS)  # each lead at every source taking it

    assert main(["demo-case", "--intake-url", intake_url]) == 0
    out = capsys.readouterr().out
    assert "0 new lead(s)" in out and f"{len(DEMO_LEADS)} already delivered" in out
    assert store.inbox_after(first[-1].id, limit=1000) == []  # no inbox row: nothing new to queue
    assert ingest(store, store.inbox_after(0, limit=1000), catalog)[0] == 0


def test_the_demo_case_of_another_case_is_a_new_delivery(store, intake_url, capsys) -> None:
    assert main(["demo-case", "--intake-url", intake_url]) == 0
    assert main(["demo-case", "--intake-url", intake_url, "--case-id", "case-demo-2"]) == 0
    assert f"{len(DEMO_LEADS)} new lead(s)" in capsys.readouterr().out.splitlines()[1]
    assert len(store.inbox_after(0, limit=1000)) == 2 * len(DEMO_LEADS)


def test_the_demo_case_against_a_stopped_intake_says_so_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(tmp_path))
    with socket.socket() as closed:  # bound, not listening: a connection is refused, as by a stopped intake
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        assert main(["demo-case", "--intake-url", url]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"investigations: the intake at {url} is not answering (start it with `make run` or "
                   "`investigations intake`)\n")
