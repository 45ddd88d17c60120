"""`investigations changes --case ID` lists what changed in a case's leads, by source and record
key, a lead's first records shown as first seen; an unknown case or a bad --since is an error."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from investigations.adapters import ParsedRecord
from investigations.cli import main
from investigations.config import Settings
from investigations.evidence.records import RecordStore
from investigations.intake.leads import normalize_lead
from investigations.store import StateStore

NOW = datetime.now(UTC)


@pytest.fixture
def case(tmp_path, monkeypatch):
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(tmp_path))
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    lead, other = normalize_lead("domain", "example.com"), normalize_lead("domain", "other.example")
    store.add_lead(lead, case_id="case-1")
    store.add_lead(other, case_id="case-2")
    records = RecordStore(Settings.from_env().records_dir)
    records.write("robust", lead.id, [ParsedRecord("a", None, {"v": 1})], fetched_at=NOW - timedelta(days=2))
    records.write("robust", lead.id, [ParsedRecord("a", None, {"v": 1}), ParsedRecord("new-cert", None, {"v": 2})],
                  fetched_at=NOW - timedelta(hours=1))
    records.write("robust", other.id, [ParsedRecord("z", None, {"v": 3})], fetched_at=NOW)
    yield store
    store.close()


def test_changes_lists_a_case_s_changes_first_seen_then_added(case, capsys) -> None:
    assert main(["changes", "--case", "case-1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["lead"], r["first"], r["added"]) for r in rows] == [
        ("domain:example.com", True, ["a"]), ("domain:example.com", False, ["new-cert"])]
    assert main(["changes", "--case", "case-1"]) == 0
    out = capsys.readouterr().out
    assert "first seen: 1" in out and "+1 added" in out and "new-cert" in out and "other.example" not in out


def test_since_keeps_only_the_newer_changes(case, capsys) -> None:
    assert main(["changes", "--case", "case-1", "--since", "1d", "--json"]) == 0
    assert [r["added"] for r in json.loads(capsys.readouterr().out)] == [["new-cert"]]
    assert main(["changes", "--case", "case-1", "--since", (NOW + timedelta(minutes=1)).isoformat()]) == 0
    assert "no changes in case case-1 since" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["changes", "--case", "nosuch"], "no case 'nosuch'; `investigations cases list`"),
    (["changes", "--case", "case-1", "--since", "yesterday"], "neither a duration"),
])
def test_an_unknown_case_or_a_bad_since_is_an_error(case, capsys, argv, message) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
