"""Schema migrations on SQLite and Postgres (in a schema of its own): an old database reaches the
current version keeping its rows, a new one gets the same tables as a migrated one.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, inspect, select

from investigations.collection.events import Outcome
from investigations.intake.leads import normalize_lead
from investigations.pacing import GapSampler, RateLanes, aimd
from investigations.pacing.lanes import LaneSpec
from investigations.scheduling.cadence import ChangeHistory
from investigations.scheduling.dispatch import plan_recurring
from investigations.sources.specs import ThrottleSpec, parse_sources
from investigations.store import StateStore
from investigations.store import schema as s
from investigations.store.engine import make_engine
from investigations.store.migrations import _LEADS_V1, migrate

V5_AT = datetime(2026, 12, 1, tzinfo=UTC)
FRAGILE = LaneSpec("source:fragile", rate_per_s=1.0, burst=1)
V3_LANE = {"lane": FRAGILE.name, "tat_s": 1_000.5, "not_before_s": 1_003.0, "rate_factor": 0.25,
           "updated_at_s": 1_000.0}
VISITOR = LaneSpec("identity:fragile:a", rate_per_s=1.0, burst=1, guard_rhythm=True)
V4_LANE = {"lane": VISITOR.name, "tat_s": 1_000.5, "not_before_s": 0.0, "rate_factor": 0.5, "updated_at_s": 1_000.0,
           "ceiling_factor": 0.8, "last_cut_s": 990.0}


@pytest.fixture
def engine(database: tuple[str, str | None]) -> Iterator[Engine]:
    url, schema = database
    made = make_engine(url, schema=schema)
    yield made
    made.dispose()


@pytest.fixture
def v3_database(engine: Engine, database: tuple[str, str | None]) -> Engine:
    """A database left at version 3, with one rate lane written as version 3 code wrote it."""
    _, schema = database
    assert migrate(engine, schema=schema, version=3) == 3
    with engine.begin() as conn:
        conn.execute(s.rate_lanes.insert().values(V3_LANE))
    return engine


@pytest.fixture
def v4_database(engine: Engine, database: tuple[str, str | None]) -> Engine:
    """A database left at version 4, with one identity lane written as version 4 code wrote it."""
    _, schema = database
    assert migrate(engine, schema=schema, version=4) == 4
    with engine.begin() as conn:
        conn.execute(s.rate_lanes.insert().values(V4_LANE))
    return engine


def queue_columns(engine: Engine, schema: str | None) -> list[tuple[str, bool]]:
    with engine.connect() as conn:
        return [(c["name"], c["nullable"]) for c in inspect(conn).get_columns("collection_queue", schema=schema)]


def lane_columns(engine: Engine, schema: str | None) -> list[tuple[str, bool]]:
    with engine.connect() as conn:
        return [(c["name"], c["nullable"]) for c in inspect(conn).get_columns("rate_lanes", schema=schema)]


def versions(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.scalars(select(s.schema_version.c.version).order_by(s.schema_version.c.version)))


def test_version_3_lanes_have_no_ceiling_columns(v3_database: Engine, database: tuple[str, str | None]) -> None:
    assert [name for name, _ in lane_columns(v3_database, database[1])] == [
        "lane", "tat_s", "not_before_s", "rate_factor", "updated_at_s"]


@pytest.mark.parametrize(
    ("old_database", "row", "new_fields"),
    [
        # No ceiling known and no cut on record, as for a lane that was never throttled.
        pytest.param("v3_database", V3_LANE, {"ceiling_factor": aimd.NO_CEILING, "last_cut_s": aimd.NEVER_CUT_S},
                     id="version-3"),
        # No sends remembered, as for a new lane.
        pytest.param("v4_database", V4_LANE, {"recent_sends_s": ()}, id="version-4"),
    ],
)
def test_an_old_database_migrates_to_the_current_version_keeping_its_lanes(
    old_database: str, row: dict, new_fields: dict, database: tuple[str, str | None], request: pytest.FixtureRequest
) -> None:
    engine = request.getfixturevalue(old_database)
    store = StateStore(engine, schema=database[1])
    assert store.schema_version == s.SCHEMA_VERSION
    assert versions(engine) == list(range(1, s.SCHEMA_VERSION + 1))
    assert lane_columns(engine, database[1]) == [(c.name, c.nullable) for c in s.rate_lanes.columns]
    state = RateLanes(store, sampler=GapSampler(random.Random(0))).state(row["lane"])
    assert state is not None
    assert {k: getattr(state, k) for k in row} == row
    assert {k: getattr(state, k) for k in new_fields} == new_fields  # what the old version had no column for


def test_a_migrated_lane_follows_the_ceiling_rules(v3_database: Engine, database: tuple[str, str | None]) -> None:
    store = StateStore(v3_database, schema=database[1])
    lanes = RateLanes(store, sampler=GapSampler(random.Random(0)), clock=lambda: 2_000.0)
    throttle = ThrottleSpec()
    lanes.feedback([FRAGILE], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=throttle)
    state = lanes.state(V3_LANE["lane"])
    assert state is not None
    assert state.aimd_state == aimd.on_throttle(aimd.AimdState(rate_factor=0.25), 2_000.0, throttle)


def test_version_4_lanes_have_no_recent_sends_column(v4_database: Engine, database: tuple[str, str | None]) -> None:
    assert [name for name, _ in lane_columns(v4_database, database[1])] == [
        "lane", "tat_s", "not_before_s", "rate_factor", "updated_at_s", "ceiling_factor", "last_cut_s"]


def test_a_migrated_identity_lane_remembers_its_sends(v4_database: Engine, database: tuple[str, str | None]) -> None:
    store = StateStore(v4_database, schema=database[1])
    lanes = RateLanes(store, sampler=GapSampler(random.Random(0)), clock=lambda: 2_000.0)
    reservation = lanes.reserve([VISITOR], max_wait_s=60.0)
    state = lanes.state(VISITOR.name)
    assert state is not None and state.recent_sends_s == (2_000.0 + reservation.wait_s,)


def test_a_new_database_has_the_declared_lane_columns_like_a_migrated_one(
    engine: Engine, database: tuple[str, str | None]
) -> None:
    _, schema = database
    migrate(engine, schema=schema)
    declared = [(column.name, column.nullable) for column in s.rate_lanes.columns]
    assert lane_columns(engine, schema) == declared
    assert versions(engine) == list(range(1, s.SCHEMA_VERSION + 1))


def test_migrating_to_an_unknown_version_is_refused(engine: Engine, database: tuple[str, str | None]) -> None:
    with pytest.raises(ValueError, match=f"no schema version {s.SCHEMA_VERSION + 1}"):
        migrate(engine, schema=database[1], version=s.SCHEMA_VERSION + 1)



@pytest.fixture
def v5_database(engine: Engine, database: tuple[str, str | None]) -> Engine:
    """A database left at version 5, with one queued collection written as version 5 code wrote it."""
    _, schema = database
    assert migrate(engine, schema=schema, version=5) == 5
    assert "handover_key" not in [name for name, _ in queue_columns(engine, schema)]
    with engine.begin() as conn:
        conn.execute(s.collection_queue.insert().values(
            source="robust", lead_id="domain-1", origin="backfill:1", priority_class="backfill", state="queued",
            not_before=V5_AT, enqueued_at=V5_AT))
    return engine


def test_a_version_5_database_migrates_keeping_its_queue_whose_rows_belong_to_no_batch(
    v5_database: Engine, database: tuple[str, str | None]
) -> None:
    store = StateStore(v5_database, schema=database[1])
    assert versions(v5_database) == list(range(1, s.SCHEMA_VERSION + 1))
    assert queue_columns(v5_database, database[1]) == [(c.name, c.nullable) for c in s.collection_queue.columns]
    (row,) = store.dispatch("robust", limit=5, now=V5_AT)
    assert row.lead_id == "domain-1"
    store.assign_handover([row.id], handover_key="robust:batch:1")
    assert store.handover_leads("robust:batch:1") == ["domain-1"]


def test_a_version_6_database_migrates_keeping_its_collections_whose_fields_are_not_known(
    engine: Engine, database: tuple[str, str | None]
) -> None:
    _, schema = database
    assert migrate(engine, schema=schema, version=6) == 6
    with engine.begin() as conn:
        conn.execute(s.collections.insert().values(
            source="robust", lead_id="domain-1", outcome="ok", records=3, content_hash="h", path="p", run_id="r",
            last_attempt_at=V5_AT, last_success_at=V5_AT))
    store = StateStore(engine, schema=schema)
    with engine.connect() as conn:
        columns = [(c["name"], c["nullable"]) for c in inspect(conn).get_columns("collections", schema=schema)]
    assert columns == [(c.name, c.nullable) for c in s.collections.columns]
    collection = store.collection("robust", "domain-1")
    assert collection is not None and collection.records == 3 and collection.common_fields is None


def test_a_version_8_database_migrates_and_an_incident_under_way_is_dated_from_its_canary_s_last_answer(
    engine: Engine, database: tuple[str, str | None]
) -> None:
    catalog = parse_sources("""
sources:
  - name: quiet
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://quiet.example/api?q={value}"}
    expected_min_records: 1
    canaries: [{kind: domain, value: canary.example}]
""")
    canary = catalog.get("quiet").canaries[0].lead.id
    _, schema = database
    assert migrate(engine, schema=schema, version=8) == 8
    with engine.begin() as conn:  # the canary answered empty before the upgrade
        conn.execute(s.collections.insert().values(
            source="quiet", lead_id=canary, outcome="empty", records=0, content_hash="h", path="p", run_id="r",
            last_attempt_at=V5_AT, last_success_at=V5_AT))
    store = StateStore(engine, schema=schema)
    assert versions(engine) == list(range(1, s.SCHEMA_VERSION + 1))
    with engine.connect() as conn:
        columns = [(c["name"], c["nullable"]) for c in inspect(conn).get_columns("source_incidents", schema=schema)]
    assert columns == [(c.name, c.nullable) for c in s.source_incidents.columns]
    assert store.source_incident("quiet") is None  # nothing on record until the planner's next pass
    (plan,) = plan_recurring(store, catalog, now=V5_AT + timedelta(minutes=1))
    assert plan.failing_since == V5_AT


def test_a_version_9_database_migrates_and_each_lead_s_next_answer_is_compared_with_its_last_one(
    engine: Engine, database: tuple[str, str | None]
) -> None:
    _, schema = database
    assert migrate(engine, schema=schema, version=9) == 9
    later = V5_AT + timedelta(hours=6)
    with engine.begin() as conn:  # collections as version 9 code wrote them
        conn.execute(s.collections.insert(), [
            # its last answer had records: what its next is compared with
            dict(source="robust", lead_id="domain-1", outcome="ok", records=3, content_hash="h1", path="p",
                 run_id="r", last_attempt_at=V5_AT, last_success_at=V5_AT),
            # failed since an answer with records: that answer still is the one to compare with
            dict(source="robust", lead_id="domain-2", outcome="failed", records=2, content_hash="h2", path="p",
                 run_id="r", last_attempt_at=later, last_success_at=V5_AT),
            # empty, or never answered: nothing to compare with
            dict(source="robust", lead_id="domain-3", outcome="empty", records=0, content_hash="h3", path="p",
                 run_id="r", last_attempt_at=V5_AT, last_success_at=V5_AT),
            dict(source="robust", lead_id="domain-4", outcome="failed", records=0, content_hash=None, path=None,
                 run_id="r", last_attempt_at=V5_AT, last_success_at=None),
        ])
    store = StateStore(engine, schema=schema)
    assert versions(engine) == list(range(1, s.SCHEMA_VERSION + 1))
    with engine.connect() as conn:
        columns = [(c["name"], c["nullable"]) for c in inspect(conn).get_columns("lead_visits", schema=schema)]
    assert columns == [(c.name, c.nullable) for c in s.lead_visits.columns]
    assert store.change_history("robust", "domain-1") == ChangeHistory(V5_AT.timestamp(), "h1")
    assert store.change_history("robust", "domain-2") == ChangeHistory(V5_AT.timestamp(), "h2")
    assert store.change_history("robust", "domain-3") is None and store.change_history("robust", "domain-4") is None
    store.complete_collection(source="robust", lead_id="domain-1", outcome="ok", records=3, content_hash="h9",
                              path="p", run_id="r2", now=later)
    history = store.change_history("robust", "domain-1")
    assert history is not None and history.visits == ((6 * 3600.0, True),)  # the first visit after the upgrade counts


def test_a_version_11_database_migrates_and_a_source_has_no_plan_on_record_until_the_planner_s_next_pass(
    engine: Engine, database: tuple[str, str | None]
) -> None:
    catalog = parse_sources("""
sources:
  - name: learned
    adapter: json_api
    lead_kinds: [domain]
    request: {url: "https://learned.example/api?q={value}"}
    recrawl: {min: 1h, max: 30d, every: 6h}
""")
    _, schema = database
    assert migrate(engine, schema=schema, version=11) == 11
    with engine.connect() as conn:
        assert not inspect(conn).has_table("cadence_plans", schema=schema)
    store = StateStore(engine, schema=schema)
    assert versions(engine) == list(range(1, s.SCHEMA_VERSION + 1))
    with engine.connect() as conn:
        columns = [(c["name"], c["nullable"]) for c in inspect(conn).get_columns("cadence_plans", schema=schema)]
    assert columns == [(c.name, c.nullable) for c in s.cadence_plans.columns]
    assert store.cadence_plan("learned") is None
    lead = normalize_lead("domain", "learned.example")  # a monitored lead: a plan over none is not kept
    store.add_lead(lead, case_id="case-1")
    store.complete_collection(source="learned", lead_id=lead.id, outcome="ok", records=1, content_hash="h",
                              path="p", run_id=None, now=V5_AT - timedelta(hours=1))
    plan_recurring(store, catalog, now=V5_AT)
    assert store.cadence_plan("learned") is not None



def test_a_version_12_database_migrates_with_every_lead_still_a_partition(
    engine: Engine, database: tuple[str, str | None]
) -> None:
    _, schema = database
    assert migrate(engine, schema=schema, version=12) == 12
    with engine.begin() as conn:
        conn.execute(_LEADS_V1.insert().values(lead_id="domain-1", kind="domain", value="one.example",
                                               created_at=V5_AT))
    store = StateStore(engine, schema=schema)
    assert versions(engine) == list(range(1, s.SCHEMA_VERSION + 1))
    with engine.connect() as conn:
        columns = [(c["name"], c["nullable"]) for c in inspect(conn).get_columns("leads", schema=schema)]
        indexes = {index["name"] for table in ("leads", "collection_queue", "collections")
                   for index in inspect(conn).get_indexes(table, schema=schema)}
    assert columns == [(c.name, c.nullable) for c in s.leads.columns]
    assert {"ix_leads_retired_at", "ix_queue_state_lead", "ix_collections_last_attempt"} <= indexes
    assert store.lead_partition_counts() == {"active": 1, "retired": 0}
    assert store.partition_keys_since(None) == ["domain-1"]


def test_a_version_13_databases_leads_keep_their_ids_as_partition_keys_and_new_leads_are_keyed_by_value(
    engine: Engine, database: tuple[str, str | None]
) -> None:
    _, schema = database
    assert migrate(engine, schema=schema, version=13) == 13
    old, new = normalize_lead("domain", "old.example"), normalize_lead("domain", "new.example")
    with engine.begin() as conn:
        conn.execute(_LEADS_V1.insert().values(lead_id=old.id, kind=old.kind, value=old.value, created_at=V5_AT))
    store = StateStore(engine, schema=schema)
    store.add_lead(new, now=V5_AT + timedelta(seconds=1))
    store.add_lead(old)  # registered again: its key stays the one its history in Dagster is under
    assert store.partition_keys_of([old.id, new.id]) == {old.id: old.id, new.id: "domain:new.example"}
    assert store.partition_keys_since(None) == [old.id, "domain:new.example"]
    assert store.get_lead_keyed(new.id) == (new, "domain:new.example")
