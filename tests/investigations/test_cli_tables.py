"""Every table the `investigations` command prints fits a 100-column console: long values fold
within their column, whole, never cut short with "…"."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from investigations.cli import main
from investigations.collection.events import FetchEvent, Outcome
from investigations.evidence.captures import Capture
from investigations.evidence.records import RecordStore
from investigations.identities import IdentityPool, parse_identities
from investigations.intake.leads import normalize_lead
from investigations.pacing import GapSampler, RateLanes
from investigations.pacing.lanes import identity_lane, source_lane
from investigations.scheduling.cadence import SourcePlan
from investigations.sources.specs import load_sources
from investigations.store import StateStore

SOURCES = Path(__file__).resolve().parents[2] / "sources.yaml"
WIDTH = 100
BOUNDS = " │┃"  # what stands between two columns' values: spaces, and the rules of a ruled table

LEAD = normalize_lead("domain", "northwind-traders-international-holdings.example")
OTHER = normalize_lead("username", "robin_example")
CASE = "case-2024-0117-northwind-traders-international-holdings"
ERROR = "HTTP 503 [retry after 30 s] from the source, 4 attempts over 31 s (the source kept failing)"
FIELDS = '{"type":"certificate","value":"CN=northwind-traders-international-holdings.example, O=Northwind"}'
CAPTURE_ID = "<urn:uuid:3f2b8c1e-8a2d-4d8e-9b1a-2c7f5e6d4a3b>"
WARC_FILE = f"evidence/robust/2025-01-01/{LEAD.id}-0f1e2d3c4b5a69788796a5b4c3d2e1f0.warc.gz"
HOLDER = "run-abcdef01-2345-6789-abcd-ef0123456789"


class Record:
    def __init__(self, key: str) -> None:
        self.key, self.url = key, f"https://robust.example/{key}"
        self.fields = {"type": "certificate", "value": "CN=northwind-traders-international-holdings.example, "
                                                       "O=Northwind"}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StateStore]:
    """A state store and records with long values in every table: ids, cases, errors, records, captures, lanes."""
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(SOURCES))
    monkeypatch.delenv("COLUMNS", raising=False)
    store = StateStore.from_url(f"sqlite:///{tmp_path / 'state.db'}")
    for lead in (LEAD, OTHER):
        store.add_lead(lead, case_id=CASE)
    store.complete_collection(source="robust", lead_id=LEAD.id, outcome="ok", records=2, content_hash="h", path="/p",
                              run_id="r")
    store.put_dead_letter(source="flaky", lead_id=LEAD.id, reason_group="transient", last_status=503, attempts=4,
                          last_error=ERROR)
    for source, outcome, status in (("robust", Outcome.OK, 200), ("fragile", Outcome.THROTTLED, 429)):
        store.record_fetches(
            FetchEvent(source=source, lead_id=LEAD.id, identity_id="direct", url="https://x.example/", method="GET",
                       status=status, outcome=outcome, latency_ms=1234.0, bytes=100, attempt=1,
                       at=datetime.now(UTC))
            for _ in range(7))
    now = datetime.now(UTC)
    captures = [Capture(capture_id=CAPTURE_ID, warc_file=WARC_FILE, offset=123456, payload_sha256="ab" * 32,
                        fetched_at=now, url="https://robust.example/api", identity_id="dc1-europe-west-identity-a")
                for _ in range(2)]
    RecordStore(tmp_path / "records").write("robust", LEAD.id, [Record("rec-0001-certificate"), Record("rec-0002")],
                                            fetched_at=now, captures=captures, parser_version="json_api/1.2.3")
    pool = IdentityPool(store, parse_identities("""
tiers: [datacenter]
identities:
  - {id: dc1-europe-west-identity-a, range: dc1-europe-west, tier: datacenter}
  - {id: dc1-europe-west-identity-b, range: dc1-europe-west, tier: datacenter}
""", env={}), rng=random.Random(1))
    assert pool.acquire("robust", holder=HOLDER, ttl_s=600) is not None
    flaky = load_sources(SOURCES).get("flaky")
    RateLanes(store, sampler=GapSampler(random.Random(1))).feedback(
        [source_lane(flaky), identity_lane(flaky, "dc1-europe-west-identity-a")], outcome=Outcome.THROTTLED,
        retry_after_s=None, throttle=flaky.throttle)
    yield store
    pool.close()
    store.close()


def shown_whole(out: str, value: str) -> bool:
    """`value` is in `out` whole: on one line, or folded down one column, piece under piece, every piece
    starting where the first starts (a left-justified column) or ending where it ends (right-justified).
    Spaces do not count: a value may wrap between its words."""
    lines = out.splitlines()
    want = "".join(value.split())
    for row, line in enumerate(lines):
        for start in range(len(line)):
            for end in _ends(line, start, want):
                rest = want[len(_squashed(line[start:end])):]
                if not rest or _continues(lines, row + 1, rest, start, left=True) or _continues(
                        lines, row + 1, rest, end, left=False):
                    return True
    return False


def _continues(lines: Sequence[str], row: int, rest: str, anchor: int, *, left: bool) -> bool:
    """The rest of a value is folded from line `row` on, each piece starting (`left`) or ending at `anchor`."""
    if row >= len(lines):
        return False
    line = lines[row]
    if left:
        spans = [(anchor, end) for end in _ends(line, anchor, rest)]
    else:
        spans = [(start, anchor) for start in range(anchor)
                 if _starts(line, start) and _stops(line, anchor) and rest.startswith(_squashed(line[start:anchor]))]
    for start, end in spans:
        piece = _squashed(line[start:end])
        if piece and (piece == rest or _continues(lines, row + 1, rest[len(piece):], anchor, left=left)):
            return True
    return False


def _ends(line: str, start: int, want: str) -> Iterator[int]:
    """Where a piece of `want` that starts at `start` may end."""
    if not _starts(line, start):
        return
    for end in range(start + 1, len(line) + 1):
        if not want.startswith(_squashed(line[start:end])):
            return
        if _stops(line, end):
            yield end


def _starts(line: str, start: int) -> bool:
    """A piece of a value may start here: after a space, a rule or the line's start."""
    return start < len(line) and line[start] not in BOUNDS and (start == 0 or line[start - 1] in BOUNDS)


def _stops(line: str, end: int) -> bool:
    """A piece of a value may end here: before a space, a rule or the line's end."""
    return 0 < end <= len(line) and line[end - 1] not in BOUNDS and (end == len(line) or line[end] in BOUNDS)


def _squashed(text: str) -> str:
    return "".join(text.split())


def test_shown_whole_finds_a_value_folded_down_its_column_and_nothing_else() -> None:
    table = (" source ┃ error     \n"
             " flaky  │ HTTP 503  \n"
             "        │ Service U \n"
             "        │ navailabl \n"
             "        │ e         \n"
             " slow   │    123456 \n"
             "        │        78 \n")
    assert shown_whole(table, "HTTP 503 Service Unavailable") and shown_whole(table, "12345678")
    assert not shown_whole(table, "HTTP 503 Unavailable") and not shown_whole(table, "flakyslow")


def _values(store: StateStore) -> dict[str, list[str]]:
    """For each command, values its table shows, each of which must be seen whole."""
    (letter,) = store.dead_letters()
    (case,) = store.cases_overview()
    lead_row = next(row for row in store.leads_overview() if row["lead_id"] == LEAD.id)
    collected = lead_row["collections"]["robust"]["last_success_at"].isoformat(timespec="seconds")
    return {
        "fleet": ["robust", "fragile", "flaky", "quiet", "slow", "blocked", "1234/1234", "0.00/5", "10/10",
                  "closed", "fragile: blocked: 7 of 7 requests throttled or blocked", "dc1-europe-west-identity-a",
                  "learned ceiling r/s"],
        "leads list": [LEAD.id, OTHER.id, LEAD.value, CASE, "username", "not collected", collected],
        "cases list": [CASE, "active", case["created_at"].isoformat(timespec="seconds")],
        "dlq list": [LEAD.id, "transient", "503", ERROR, letter.last_seen.isoformat(timespec="seconds")],
        "records": [LEAD.id, "rec-0001-certificate", "rec-0002", FIELDS],
        "records --captures": ["rec-0001-certificate", CAPTURE_ID, f"{WARC_FILE}@123456", "ab" * 8,
                               "dc1-europe-west-identity-a", "json_api/1.2.3"],
        "identities": ["dc1-europe-west-identity-a", "dc1-europe-west-identity-b", "dc1-europe-west", "datacenter",
                       HOLDER, "available", "leased"],
    }


COMMANDS = ["fleet", "leads list", "cases list", "dlq list", "records", "records --captures", "identities"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_table_fits_100_columns_and_shows_every_value_whole(state, monkeypatch, capsys, command) -> None:
    assert main(command.split()) == 0
    unfolded = capsys.readouterr().out  # piped output: 240 columns
    assert max(map(len, unfolded.splitlines())) > WIDTH  # the table needs folding at 100 columns

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    assert main(command.split()) == 0
    out = capsys.readouterr().out
    too_long = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not too_long, f"{len(too_long)} line(s) past {WIDTH} columns:\n" + "\n".join(too_long)
    assert "…" not in out
    cut = [value for value in _values(state)[command] if not shown_whole(out, value)]
    assert not cut, f"not shown whole: {cut}\n{out}"


def test_the_fleet_is_one_table_where_it_fits_and_two_where_it_does_not(state, monkeypatch, capsys) -> None:
    def first_words(out: str) -> list[str]:
        """Each line's first word, up to the pacing table that follows the fleet's."""
        fleet = out.split("\npacing:")[0]
        return [line.split()[0] for line in fleet.splitlines() if line.strip()]

    assert main(["fleet"]) == 0  # piped output: 240 columns
    wide = first_words(capsys.readouterr().out)
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    assert main(["fleet"]) == 0
    narrow = first_words(capsys.readouterr().out)
    assert (wide.count("source"), wide.count("fragile")) == (1, 1)
    assert (narrow.count("source"), narrow.count("fragile")) == (2, 2)  # each half led by the source


@pytest.mark.parametrize("command", ["leads list", "dlq list", "records"])
def test_a_lead_id_stays_on_one_line_while_longer_values_fold(state, monkeypatch, capsys, command) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    assert main(command.split()) == 0
    out = capsys.readouterr().out
    assert LEAD.id in out  # on one line, to copy into `--lead`


# Sources on each kind of cadence: robust (collected in `state`) fixed; the others learned, collecting
# `state`'s lead, one planned now, one under a stored plan whose budget was short, one monitoring none.
CADENCED = """
sources:
  - {name: robust, adapter: json_api, lead_kinds: [domain], request: {url: "https://robust.example/{value}"},
     recrawl_every: 6h, daily_budget_usd: 5}
  - {name: learned, adapter: json_api, lead_kinds: [domain], request: {url: "https://learned.example/{value}"},
     recrawl: {min: 1h, max: 30d, every: 6h}}
  - {name: starved, adapter: json_api, lead_kinds: [domain], request: {url: "https://starved.example/{value}"},
     recrawl: {min: 1h, max: 1d, every: 6h}}
  - {name: unseen, adapter: json_api, lead_kinds: [domain], request: {url: "https://unseen.example/{value}"},
     recrawl: {min: 2h, max: 10d}}
"""


@pytest.fixture
def cadenced(state: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StateStore:
    sources = tmp_path / "cadenced.yaml"
    sources.write_text(CADENCED)
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(sources))
    specs = load_sources(sources)
    for name in ("learned", "starved"):  # one answer with records: the lead changes at its source's prior
        state.complete_collection(source=name, lead_id=LEAD.id, outcome="ok", records=2, content_hash="h", path="/p",
                                  run_id="r", change_prior_s=specs.get(name).recrawl.prior_s)
    state.keep_cadence_plan("starved", SourcePlan(math.inf, short=True), now=datetime.now(UTC))
    return state


def test_the_fleet_s_cadence_is_fixed_or_learned_in_its_json(cadenced, capsys) -> None:
    assert main(["fleet", "--json"]) == 0
    cadence = {row["source"]: row["cadence"] for row in json.loads(capsys.readouterr().out)}
    assert cadence["robust"] == {"kind": "fixed", "interval_s": 21600.0, "min_s": 21600.0, "max_s": 21600.0,
                                 "budget_short": False, "planned_at": None}
    # Not planned yet: planned now, the lead at its source's prior, within what the fixed 6 h would spend.
    assert (cadence["learned"]["kind"], cadence["learned"]["planned_at"]) == ("learned", None)
    assert cadence["learned"]["interval_s"] == pytest.approx(21600.0)
    assert (cadence["starved"]["interval_s"], cadence["starved"]["budget_short"]) == (86400.0, True)
    assert cadence["starved"]["planned_at"] is not None  # read from the planner's stored plan
    assert cadence["unseen"]["interval_s"] is None


@pytest.mark.parametrize("width", [240, WIDTH])
def test_the_fleet_table_shows_each_source_s_cadence_whole_in_its_holding_half(cadenced, monkeypatch, capsys,
                                                                                width) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["fleet"]) == 0
    out = capsys.readouterr().out
    fleet = out.split("\npacing:")[0]
    assert not [line for line in out.splitlines() if len(line) > width] and "…" not in out
    assert [line.split()[0] for line in fleet.splitlines()].count("source") == (1 if width > WIDTH else 2)
    header = next(line for line in fleet.splitlines() if "cadence" in line.split()).split()
    assert header[header.index("cadence") + 1] == "fresh"  # with what the source holds
    assert ("health" in header) is (width > WIDTH)  # narrow: in the holding half's table
    cells = ["fixed 6h", "learned ~6h", "learned ~1d (short)", "learned -"]
    cut = [cell for cell in cells if not shown_whole(fleet, cell)]
    assert not cut, f"not shown whole: {cut}\n{out}"
    if width > WIDTH:  # room enough: each on one line
        assert all(cell in fleet for cell in cells)
    assert "  starved: cadence: the budget is short: every lead at its max, 1d" in out
    assert "learned: cadence" not in out
