"""The new-lead sensor queues inbox leads and hands each source's backlog to Dagster within bounds."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context

from assets.jobs import build_source_job
from assets.naming import job_name, pool_name, source_asset_key
from investigations.intake.leads import normalize_lead
from investigations.scheduling.dispatch import DispatchPlan, Handover, background_runs_for, batch_size, ingest
from investigations.scheduling.priority import (
    CASE_TAG,
    CHECKS_IN_STEP_TAG,
    DAGSTER_PRIORITY,
    HANDOVER_TAG,
    PRIORITY_CLASS_TAG,
    PriorityClass,
)
from investigations.sources.specs import load_sources
from investigations.store import StateStore
from resources.fleet import FleetResource
from sensors.new_leads import (
    PICKUP_GRACE_S,
    build_new_lead_sensor,
    build_new_lead_sensors,
    has_turn,
    partition_order_of,
    read_cursor,
    run_requests_for,
    write_cursor,
)
from tests.fakes import FakeTime

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def world(sandbox_env, tmp_path, monkeypatch):
    # robust gets a small backpressure bound so the tests can fill it.
    text = (ROOT / "sources.yaml").read_text().replace("    concurrency: 3\n", "    concurrency: 3\n    max_in_flight: 2\n", 1)
    path = tmp_path / "sources.yaml"
    path.write_text(text)
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(path))
    catalog = load_sources(path)
    assert catalog.get("robust").max_in_flight == 2
    store = StateStore.from_url(f"sqlite:///{sandbox_env / 'state.db'}")
    # Ticks return at once here; the wait for the inbox has tests of its own below.
    sensor = build_new_lead_sensor(catalog, [build_source_job(spec) for spec in catalog.sources], wait_for_leads_s=0)
    yield catalog, store, sensor, DagsterInstance.ephemeral()
    store.close()


def _waiting_sensor(catalog, fake: FakeTime, wait_s: float = 3.5, *, turn: int = 0, turns: int = 1):
    return build_new_lead_sensor(catalog, [build_source_job(spec) for spec in catalog.sources], turn=turn,
                                 turns=turns, wait_for_leads_s=wait_s, clock=fake.clock, sleep=fake.sleep)


def _evaluate(sensor, instance, cursor=None):
    with build_sensor_context(instance=instance, cursor=cursor, resources={"fleet": FleetResource()}) as context:
        return sensor(context)


def _accept(store, values, *, webhook, sources=("robust", "flaky"), priority="interactive"):
    leads = [normalize_lead("domain", value) for value in values]
    store.accept_leads(webhook_id=webhook, case_id="c1", leads=leads, sources=list(sources) if sources else None,
                       priority_class=priority)
    return leads


def _handed_leads(store, requests) -> list[str]:
    """The leads the requested runs still owe, from their handovers in the fleet's queue."""
    return sorted(lead for request in requests for lead in store.handover_leads(request.tags[HANDOVER_TAG]))


def test_a_delivery_s_leads_become_partitions_and_one_run_per_wanted_source(world) -> None:
    _, store, sensor, instance = world
    leads = _accept(store, ["example.com", "example.org"], webhook="w1")
    result = _evaluate(sensor, instance)
    assert sorted(instance.get_dynamic_partitions("leads")) == sorted(lead.partition_key for lead in leads)
    assert sorted(r.job_name for r in result.run_requests) == sorted(job_name(s) for s in ("robust", "flaky"))
    for request in result.run_requests:
        assert request.tags["dagster/priority"] == str(DAGSTER_PRIORITY[PriorityClass.INTERACTIVE])
        assert request.tags[PRIORITY_CLASS_TAG] == "interactive"
        assert request.tags[CASE_TAG] == "c1"
        assert sorted(store.handover_leads(request.tags[HANDOVER_TAG])) == sorted(lead.id for lead in leads)
    assert read_cursor(result.cursor)[0] == store.inbox_after(0, limit=10)[-1].id


def test_a_case_of_hundreds_of_leads_goes_out_in_runs_sized_by_the_source_rate(world) -> None:
    catalog, store, sensor, instance = world
    spec = catalog.get("fragile")  # 1.5/s: 135-lead batches
    leads = _accept(store, [f"lead{i}.example" for i in range(300)], webhook="big", sources=["fragile"])
    requests = _evaluate(sensor, instance).run_requests
    sizes = sorted(len(store.handover_leads(r.tags[HANDOVER_TAG])) for r in requests)
    assert sizes == [300 - 2 * batch_size(spec), batch_size(spec), batch_size(spec)]
    assert {r.tags[CASE_TAG] for r in requests} == {"c1"}
    handed = [lead for r in requests for lead in store.handover_leads(r.tags[HANDOVER_TAG])]
    assert sorted(handed) == sorted(lead.id for lead in leads)


def test_two_cases_in_one_tick_go_out_in_runs_of_their_own(world) -> None:
    _, store, sensor, instance = world
    _accept(store, ["a.example"], webhook="w1", sources=["flaky"])
    store.accept_leads(webhook_id="w2", case_id="c2", leads=[normalize_lead("domain", "b.example")],
                       sources=["flaky"], priority_class="interactive")
    requests = _evaluate(sensor, instance).run_requests
    assert sorted(r.tags[CASE_TAG] for r in requests) == ["c1", "c2"]


def test_an_interactive_run_names_its_lead_by_kind_and_value_in_a_tag(world) -> None:
    _, store, sensor, instance = world
    _accept(store, ["Example.COM."], webhook="w1", sources=("robust",))
    (request,) = _evaluate(sensor, instance).run_requests
    assert request.tags["investigations/lead"] == "domain:example.com"


def test_an_empty_inbox_and_backlog_skips_with_a_reason(world) -> None:
    _, _, sensor, instance = world
    result = _evaluate(sensor, instance, cursor="0")
    assert not result.run_requests and "nothing ready in the backlog" in result.skip_reason.skip_message


def test_an_empty_tick_waits_for_the_inbox_and_requests_a_lead_that_arrives_meanwhile(world) -> None:
    catalog, store, _, instance = world
    arrived = []

    def lead_arrives_on_the_third_poll(slept) -> None:
        if len(slept) == 3:
            arrived.extend(_accept(store, ["late.example"], webhook="w-late", sources=["robust"]))

    fake = FakeTime(lead_arrives_on_the_third_poll)
    result = _evaluate(_waiting_sensor(catalog, fake), instance, cursor="0")
    assert [r.partition_key for r in result.run_requests] == [arrived[0].partition_key]
    assert len(fake.slept) == 3 and fake.now < 3.5  # it returned on the poll that saw the lead


def test_an_empty_tick_skips_once_its_wait_is_over(world) -> None:
    catalog, _, _, instance = world
    fake = FakeTime()
    result = _evaluate(_waiting_sensor(catalog, fake, wait_s=1.0), instance, cursor="0")
    assert not result.run_requests and "nothing ready in the backlog" in result.skip_reason.skip_message
    assert fake.now == pytest.approx(1.0)


def test_a_waiting_tick_hands_over_a_backfill_queued_meanwhile_at_its_next_plan(world) -> None:
    catalog, store, _, instance = world
    queued = []

    def backfill_queued_after_a_second(slept) -> None:
        if sum(slept) >= 1.0 and not queued:
            queued.extend(normalize_lead("domain", f"bulk{i}.example") for i in range(2))
            store.add_leads(queued)  # `leads add`, then `backfill`: no inbox row wakes the sensor
            store.enqueue([("robust", lead.id) for lead in queued], origin="backfill:1", priority_class="backfill")

    fake = FakeTime(backfill_queued_after_a_second)
    sensor = build_new_lead_sensor(catalog, [build_source_job(spec) for spec in catalog.sources],
                                   wait_for_leads_s=28.5, plan_every_s=3.5, clock=fake.clock, sleep=fake.sleep)
    (request,) = _evaluate(sensor, instance, cursor="0").run_requests
    assert request.tags["investigations/batch_size"] == "2"
    # The asset alone, its check judged in the step: Dagster plans no check row per partition of the range.
    assert list(request.asset_selection) == [source_asset_key("robust")] and request.asset_check_keys == []
    assert request.tags[CHECKS_IN_STEP_TAG] == "true"
    assert fake.now == pytest.approx(3.5)  # at the first plan after it was queued, not at the tick's end
    assert sorted(instance.get_dynamic_partitions("leads")) == sorted(lead.partition_key for lead in queued)


def test_a_lead_registered_while_a_tick_waits_joins_the_partitions_before_the_tick_ends(world) -> None:
    catalog, store, _, instance = world
    lead = normalize_lead("domain", "meanwhile.example")
    seen_at = []

    def registered_after_a_second(slept) -> None:
        if sum(slept) >= 1.0 and store.get_lead(lead.id) is None:
            store.add_lead(lead)  # `leads add`: no inbox row wakes the sensor
        elif not seen_at and lead.partition_key in instance.get_dynamic_partitions("leads"):
            seen_at.append(sum(slept))

    fake = FakeTime(registered_after_a_second)
    sensor = build_new_lead_sensor(catalog, [build_source_job(spec) for spec in catalog.sources],
                                   wait_for_leads_s=10.0, plan_every_s=3.5, clock=fake.clock, sleep=fake.sleep)
    result = _evaluate(sensor, instance, cursor="0")
    assert not result.run_requests and fake.now == pytest.approx(10.0)
    assert seen_at and seen_at[0] <= 3.5 + 0.2 + 1e-9  # synced at the first plan, while the tick waited


def test_a_tick_with_work_returns_without_waiting(world) -> None:
    catalog, store, _, instance = world
    _accept(store, ["example.com"], webhook="w1", sources=["robust"])
    fake = FakeTime()
    result = _evaluate(_waiting_sensor(catalog, fake), instance)
    assert len(result.run_requests) == 1 and fake.slept == []


@pytest.mark.parametrize(
    ("cursor", "last", "turn", "expected"),
    [
        (4, 4, 0, False),  # nothing new
        (4, 5, 0, False),  # row 5 is turn 1's
        (4, 5, 1, True),
        (4, 6, 0, True),  # rows 5 and 6: one for each turn
        (4, 6, 1, True),
        (5, 6, 1, False),
    ],
)
def test_consecutive_inbox_rows_wake_sensors_in_turn(cursor, last, turn, expected) -> None:
    assert has_turn(cursor, last, turn=turn, turns=2) is expected


def test_new_leads_and_its_relay_take_turns(world) -> None:
    catalog, *_ = world
    sensors = build_new_lead_sensors(catalog, [build_source_job(spec) for spec in catalog.sources], turns=2)
    assert [sensor.name for sensor in sensors] == ["new_leads", "new_leads_relay1"]


def test_a_waiting_tick_leaves_the_other_turn_s_lead_to_its_sensor_and_wakes_for_its_own(world) -> None:
    catalog, store, _, instance = world
    start = store.last_inbox_id()  # the next rows are start + 1 (turn 1 of 2) and start + 2 (turn 0)
    arrived = []

    def leads_arrive(slept) -> None:
        if len(slept) == 1:
            _accept(store, ["other.example"], webhook="w-other", sources=["robust"])
            ingest(store, store.inbox_after(start, limit=10), catalog)
            store.dispatch("robust", limit=5)  # its own sensor took it at once
        if len(slept) == 6:
            arrived.extend(_accept(store, ["own.example"], webhook="w-own", sources=["robust"]))

    fake = FakeTime(leads_arrive)
    result = _evaluate(_waiting_sensor(catalog, fake, turn=(start + 2) % 2, turns=2), instance, cursor=str(start))
    assert len(fake.slept) == 6  # it looked at the other turn's lead after the grace, found it taken, waited on
    assert _handed_leads(store, result.run_requests) == sorted(lead.id for lead in arrived)


def test_a_lead_of_another_turn_left_waiting_is_taken_after_the_grace(world) -> None:
    """Its own sensor's tick returned (it had runs to hand over): the lead does not wait for the next loop."""
    catalog, store, _, instance = world
    start = store.last_inbox_id()
    arrived = []

    def lead_arrives(slept) -> None:
        if len(slept) == 1:
            arrived.extend(_accept(store, ["orphan.example"], webhook="w-orphan", sources=["robust"]))

    fake = FakeTime(lead_arrives)
    result = _evaluate(_waiting_sensor(catalog, fake, turn=start % 2, turns=2), instance, cursor=str(start))
    assert _handed_leads(store, result.run_requests) == [arrived[0].id]
    assert fake.now <= 0.2 + PICKUP_GRACE_S + 0.2 + 1e-9  # the grace and a poll, not the tick's 3.5 s wait


def test_a_tick_whose_lead_another_sensor_took_waits_on(world) -> None:
    catalog, store, _, instance = world

    def lead_arrives_and_is_taken(slept) -> None:
        if len(slept) == 2:
            _accept(store, ["taken.example"], webhook="w-taken", sources=["robust"])
            ingest(store, store.inbox_after(0, limit=10), catalog)
            assert store.dispatch("robust", limit=5)  # the other sensor's tick got there first

    fake = FakeTime(lead_arrives_and_is_taken)
    result = _evaluate(_waiting_sensor(catalog, fake, wait_s=2.0), instance, cursor="0")
    assert not result.run_requests and fake.now == pytest.approx(2.0)
    assert read_cursor(result.cursor)[0] == store.last_inbox_id()


def test_a_relay_hands_over_interactive_work_only(world) -> None:
    catalog, store, _, instance = world
    bulk = [normalize_lead("domain", f"bulk{i}.example") for i in range(2)]
    for lead in bulk:
        store.add_lead(lead, case_id="c1")
    store.enqueue([("robust", lead.id) for lead in bulk], origin="backfill:1", priority_class="backfill")
    if store.last_inbox_id() % 2:  # so that the next inbox row is the relay's (odd)
        _accept(store, ["filler.example"], webhook="filler", sources=["flaky"])
    arrived = []

    def a_fresh_lead_arrives(slept) -> None:
        if len(slept) == 1:
            arrived.extend(_accept(store, ["urgent.example"], webhook="urgent", sources=["robust"]))

    relay = _waiting_sensor(catalog, FakeTime(a_fresh_lead_arrives), turn=1, turns=2)
    (request,) = _evaluate(relay, instance).run_requests
    assert request.partition_key == arrived[0].partition_key
    assert store.queue_depths()["robust"]["ready"] == 2  # the backfill waits for new_leads


def test_a_relay_leaves_the_inbox_already_there_at_its_tick_s_start_to_new_leads(world) -> None:
    catalog, store, _, instance = world
    _accept(store, ["old.example"], webhook="old", sources=["robust"])
    relay = _waiting_sensor(catalog, FakeTime(), wait_s=0, turn=1, turns=2)
    result = _evaluate(relay, instance, cursor="0")
    assert not result.run_requests and read_cursor(result.cursor)[0] == store.last_inbox_id()
    assert store.queue_depths() == {}  # not even queued: new_leads' pass over the inbox does that


def test_a_dispatched_collection_is_not_requested_again(world) -> None:
    _, store, sensor, instance = world
    _accept(store, ["example.com"], webhook="w1", sources=["robust"])
    first = _evaluate(sensor, instance)
    assert len(first.run_requests) == 1
    again = _evaluate(sensor, instance, cursor="0")  # even when the inbox is read again
    assert not again.run_requests


def test_backpressure_holds_work_in_the_backlog_and_says_why(world) -> None:
    _, store, sensor, instance = world
    leads = _accept(store, [f"lead{i}.example" for i in range(5)], webhook="w1", sources=["robust"])
    first = _evaluate(sensor, instance)
    assert len(_handed_leads(store, first.run_requests)) == 2  # robust's max_in_flight here
    held = _evaluate(sensor, instance, cursor=first.cursor)
    assert not held.run_requests
    assert "max_in_flight 2" in held.skip_reason.skip_message and "3 wait in the backlog" in held.skip_reason.skip_message
    store.finish_dispatched("robust", _handed_leads(store, first.run_requests)[0], outcome="ok")
    store.close_collector(first.run_requests[0].run_key)  # its run ended: nothing to join
    freed = _evaluate(sensor, instance, cursor=first.cursor)
    assert len(_handed_leads(store, freed.run_requests)) == 1
    assert set(_handed_leads(store, first.run_requests + freed.run_requests)) < {lead.id for lead in leads}


def test_interactive_work_is_dispatched_before_queued_backfill(world) -> None:
    _, store, sensor, instance = world
    _accept(store, [f"bulk{i}.example" for i in range(4)], webhook="bulk", sources=["robust"], priority="backfill")
    (urgent,) = _accept(store, ["urgent.example"], webhook="urgent", sources=["robust"])
    result = _evaluate(sensor, instance)
    first, batch = result.run_requests  # the fresh lead, then the background work as one batch
    assert first.partition_key == urgent.partition_key and first.tags[PRIORITY_CLASS_TAG] == "interactive"
    assert int(batch.tags["dagster/priority"]) == DAGSTER_PRIORITY[PriorityClass.BACKFILL]
    assert len(store.handover_leads(batch.tags[HANDOVER_TAG])) == 4


def test_a_fresh_lead_joins_the_open_run_of_its_source_without_a_run_of_its_own(world) -> None:
    _, store, sensor, instance = world
    store.open_collector("robust:open", "robust", until_s=time.time() + 5)
    (lead,) = _accept(store, ["fresh.example"], webhook="w1", sources=["robust"])
    result = _evaluate(sensor, instance)
    assert not result.run_requests
    assert store.handover_leads("robust:open") == [lead.id]
    assert lead.partition_key in instance.get_dynamic_partitions("leads")  # before the open run reports it


def test_a_second_fresh_lead_joins_the_run_requested_for_the_first_before_it_starts(world) -> None:
    _, store, sensor, instance = world
    _accept(store, ["first.example"], webhook="w1", sources=["robust"])
    (first,) = _evaluate(sensor, instance).run_requests
    (second,) = _accept(store, ["second.example"], webhook="w2", sources=["robust"])
    assert not _evaluate(sensor, instance).run_requests
    assert second.id in store.handover_leads(first.run_key)  # it starts with both


def test_a_lead_whose_open_run_closed_after_the_plan_gets_a_run_of_its_own(world) -> None:
    catalog, store, _, instance = world
    (lead,) = _accept(store, ["fresh.example"], webhook="w1", sources=["robust"])
    ingest(store, store.inbox_after(0, limit=10), catalog)
    rows = tuple(store.dispatch("robust", limit=1))
    plan = DispatchPlan([Handover("robust", PriorityClass.INTERACTIVE, rows, joins="robust:closed")])
    (request,) = run_requests_for(store, instance, plan, partition_order_of(instance), catalog)
    assert request.partition_key == lead.partition_key and request.run_key != "robust:closed"
    assert store.handover_leads(request.run_key) == [lead.id]


def test_a_stale_dispatch_is_requested_again_under_a_new_run_key(world) -> None:
    _, store, sensor, instance = world
    _accept(store, ["example.com"], webhook="w1", sources=["robust"])
    (first,) = _evaluate(sensor, instance).run_requests
    store.close_collector(first.run_key)  # its run never started: it is no longer open to joins
    store.release_stale_dispatches(older_than=datetime.now(UTC) + timedelta(seconds=1))
    (again,) = _evaluate(sensor, instance).run_requests
    # Dagster never starts a run key it has seen: the same key would leave the lead uncollected.
    assert again.partition_key == first.partition_key and again.run_key != first.run_key


def test_pool_limits_on_the_instance_follow_sources_yaml(world) -> None:
    catalog, store, sensor, instance = world
    _accept(store, ["example.com"], webhook="w1")
    _evaluate(sensor, instance)
    limits = {limit.name: limit.limit for limit in instance.event_log_storage.get_pool_limits()}
    # Slots above the source's background runs: background work never holds more than those.
    assert all(limits[pool_name(spec.name)] == background_runs_for(spec) + spec.interactive_slots
               for spec in catalog.sources)


def test_leads_registered_outside_the_intake_join_the_partitions_and_go_out_as_one_batch(world) -> None:
    _, store, sensor, instance = world
    leads = [normalize_lead("domain", f"bg{i}.example") for i in range(3)]
    for lead in leads:  # as `investigations leads add` does: the state store only, no Dagster
        store.add_lead(lead, case_id="c1")
    store.enqueue([("robust", lead.id) for lead in leads], origin="backfill:1", priority_class="backfill")
    result = _evaluate(sensor, instance)
    assert set(instance.get_dynamic_partitions("leads")) == {lead.partition_key for lead in leads}
    (batch,) = result.run_requests
    assert batch.partition_key is None and batch.tags[HANDOVER_TAG] == batch.run_key
    assert sorted(store.handover_leads(batch.tags[HANDOVER_TAG])) == sorted(lead.id for lead in leads)
    order = instance.get_dynamic_partitions("leads")
    assert {batch.tags["dagster/asset_partition_range_start"], batch.tags["dagster/asset_partition_range_end"]} == {
        order[0], order[-1]}


def test_a_lead_registered_while_the_sensor_was_off_joins_the_partitions_on_its_first_tick(world) -> None:
    _, store, sensor, instance = world
    lead = normalize_lead("domain", "early.example")
    store.add_lead(lead)
    first = _evaluate(sensor, instance)
    assert instance.get_dynamic_partitions("leads") == [lead.partition_key]
    later = normalize_lead("domain", "later.example")
    store.add_lead(later)
    _evaluate(sensor, instance, cursor=first.cursor)  # a later tick reads only what joined since
    assert instance.get_dynamic_partitions("leads") == [lead.partition_key, later.partition_key]


def test_a_fresh_lead_is_dispatched_even_when_background_work_is_in_flight(world) -> None:
    _, store, sensor, instance = world
    _accept(store, [f"bulk{i}.example" for i in range(4)], webhook="bulk", sources=["robust"], priority="backfill")
    first = _evaluate(sensor, instance)
    assert len(first.run_requests) == 1  # the backlog, smaller than a batch, went out whole
    (urgent,) = _accept(store, ["urgent.example"], webhook="urgent", sources=["robust"])
    (request,) = _evaluate(sensor, instance, cursor=first.cursor).run_requests
    assert request.partition_key == urgent.partition_key


def test_a_tick_retires_a_closed_case_s_leads_once_a_minute_and_syncs_only_active_ones(world) -> None:
    _, store, sensor, instance = world
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    closed, kept = normalize_lead("domain", "closed.example"), normalize_lead("domain", "kept.example")
    store.add_lead(closed, case_id="old", now=long_ago)
    store.add_lead(kept, case_id="open", now=long_ago)
    instance.add_dynamic_partitions("leads", [closed.partition_key, kept.partition_key])
    store.set_case_status("old", "closed", now=long_ago)
    first = _evaluate(sensor, instance)
    assert instance.get_dynamic_partitions("leads") == [kept.partition_key]
    assert store.retired_lead_ids([closed.id]) == {closed.id}
    store.set_case_status("old", "active")
    _evaluate(sensor, instance, cursor=first.cursor)  # within the minute: no pass
    assert instance.get_dynamic_partitions("leads") == [kept.partition_key]
    inbox, since, _ = read_cursor(first.cursor)
    _evaluate(sensor, instance, cursor=write_cursor(inbox, since, lifecycle_at=0.0))  # a minute on
    assert sorted(instance.get_dynamic_partitions("leads")) == sorted([closed.partition_key, kept.partition_key])


def test_a_full_lifecycle_pass_goes_on_within_its_budget_then_at_the_next_tick(world, monkeypatch) -> None:
    _, store, sensor, instance = world
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    leads = [normalize_lead("domain", f"closed{n}.example") for n in range(3)]
    store.add_leads(leads, case_id="old", now=long_ago)
    instance.add_dynamic_partitions("leads", [lead.partition_key for lead in leads])
    store.set_case_status("old", "closed", now=long_ago)
    monkeypatch.setattr("sensors.new_leads.LIFECYCLE_BATCH", 1)
    monkeypatch.setattr("sensors.new_leads.LIFECYCLE_BUDGET_S", 0.0)  # one pass per tick
    first = _evaluate(sensor, instance)
    assert len(instance.get_dynamic_partitions("leads")) == 2
    assert read_cursor(first.cursor)[2] == 0.0  # the next tick passes again, not a minute later
    _evaluate(sensor, instance, cursor=first.cursor)
    assert len(instance.get_dynamic_partitions("leads")) == 1
    monkeypatch.setattr("sensors.new_leads.LIFECYCLE_BUDGET_S", 60.0)
    last = _evaluate(sensor, instance, cursor=first.cursor)
    assert instance.get_dynamic_partitions("leads") == [] and read_cursor(last.cursor)[2] > 0


def test_a_tick_queues_the_whole_inbox_in_chunks_within_its_budget(world, monkeypatch) -> None:
    _, store, sensor, instance = world
    monkeypatch.setattr("sensors.new_leads.INBOX_CHUNK", 2)
    _accept(store, [f"big{n}.example" for n in range(5)], webhook="big", sources=["robust"])
    result = _evaluate(sensor, instance)
    assert read_cursor(result.cursor)[0] == store.last_inbox_id()
    depths = store.queue_depths()["robust"]
    assert depths["ready"] + depths["dispatched"] == 5


def test_a_tick_out_of_ingest_budget_leaves_the_rest_of_the_inbox_for_the_next(world, monkeypatch) -> None:
    _, store, sensor, instance = world
    monkeypatch.setattr("sensors.new_leads.INBOX_CHUNK", 2)
    monkeypatch.setattr("sensors.new_leads.INGEST_BUDGET_S", 0.0)
    _accept(store, [f"big{n}.example" for n in range(5)], webhook="big", sources=["robust"])
    rows = store.inbox_after(0, limit=10)
    first = _evaluate(sensor, instance)
    # One chunk before it planned, one more before it returned with its runs.
    assert first.run_requests and read_cursor(first.cursor)[0] == rows[3].id
    second = _evaluate(sensor, instance, cursor=first.cursor)
    assert read_cursor(second.cursor)[0] == rows[4].id


def test_rows_that_arrive_while_a_tick_plans_are_queued_before_it_returns(world, monkeypatch) -> None:
    _, store, sensor, instance = world
    import sensors.new_leads as module

    plan = module.run_requests_for

    def arriving_meanwhile(*args, **kwargs):
        requests = plan(*args, **kwargs)
        _accept(store, ["late1.example", "late2.example"], webhook="late", sources=["robust"])
        return requests

    monkeypatch.setattr(module, "run_requests_for", arriving_meanwhile)
    _accept(store, ["first.example"], webhook="first", sources=["robust"])
    result = _evaluate(sensor, instance)
    assert result.run_requests and read_cursor(result.cursor)[0] == store.last_inbox_id()
    depths = store.queue_depths()["robust"]
    assert depths["ready"] + depths["dispatched"] == 3
