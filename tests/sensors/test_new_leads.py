"""The new-lead sensor turns inbox rows into partitions and one interactive run per wanted source."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from assets.jobs import build_source_job
from assets.naming import job_name, pool_name
from investigations.catalog import load_catalog
from investigations.config import Settings
from investigations.leads import normalize_lead
from investigations.priority import DAGSTER_PRIORITY, PRIORITY_CLASS_TAG, PriorityClass
from investigations.store import InboxItem, StateStore
from resources.fleet import FleetResource
from sensors.new_leads import build_new_lead_sensor, run_requests_for


@pytest.fixture
def world(sandbox_env):
    settings = Settings.from_env()
    catalog = load_catalog(settings.sources_path)
    store = StateStore.from_url(settings.database_url)
    sensor = build_new_lead_sensor(catalog, [build_source_job(spec) for spec in catalog.sources])
    yield catalog, store, sensor, DagsterInstance.ephemeral()
    store.close()


def _evaluate(sensor, instance, cursor=None):
    with build_sensor_context(instance=instance, cursor=cursor, resources={"fleet": FleetResource()}) as context:
        return sensor(context)


def test_inbox_rows_become_partitions_and_one_run_per_wanted_source(world) -> None:
    catalog, store, sensor, instance = world
    leads = [normalize_lead("domain", "example.com"), normalize_lead("username", "alice")]
    store.accept_leads(webhook_id="w1", case_id="c1", leads=leads, sources=["robust", "flaky"],
                       priority_class="interactive")
    result = _evaluate(sensor, instance)
    assert isinstance(result, SensorResult)
    assert sorted(result.dynamic_partitions_requests[0].partition_keys) == sorted(lead.id for lead in leads)
    pairs = sorted((r.job_name, r.partition_key) for r in result.run_requests)
    assert pairs == sorted((job_name(s), lead.id) for s in ("robust", "flaky") for lead in leads)
    request = result.run_requests[0]
    assert request.tags["dagster/priority"] == str(DAGSTER_PRIORITY[PriorityClass.INTERACTIVE])
    assert request.tags[PRIORITY_CLASS_TAG] == "interactive"
    assert result.cursor == str(store.inbox_after(0, limit=10)[-1].id)


def test_an_empty_inbox_skips_with_a_reason(world) -> None:
    _, _, sensor, instance = world
    result = _evaluate(sensor, instance, cursor="0")
    assert isinstance(result, SkipReason) and "no new leads" in result.skip_message


def test_rows_before_the_cursor_are_not_requested_again(world) -> None:
    _, store, sensor, instance = world
    store.accept_leads(webhook_id="w1", case_id="c1", leads=[normalize_lead("domain", "example.com")],
                       sources=None, priority_class="interactive")
    first = _evaluate(sensor, instance)
    assert isinstance(_evaluate(sensor, instance, cursor=first.cursor), SkipReason)


def test_run_keys_are_deterministic_for_the_same_inbox_row(world) -> None:
    _, store, sensor, instance = world
    store.accept_leads(webhook_id="w1", case_id="c1", leads=[normalize_lead("domain", "example.com")],
                       sources=None, priority_class="interactive")
    keys_a = sorted(r.run_key for r in _evaluate(sensor, instance).run_requests)
    keys_b = sorted(r.run_key for r in _evaluate(sensor, instance).run_requests)
    assert keys_a == keys_b and len(set(keys_a)) == len(keys_a)


def test_pool_limits_on_the_instance_follow_sources_yaml(world) -> None:
    catalog, store, sensor, instance = world
    store.accept_leads(webhook_id="w1", case_id="c1", leads=[normalize_lead("domain", "example.com")],
                       sources=None, priority_class="interactive")
    _evaluate(sensor, instance)
    limits = {limit.name: limit.limit for limit in instance.event_log_storage.get_pool_limits()}
    assert all(limits[pool_name(spec.name)] == spec.concurrency for spec in catalog.sources)


def test_without_sources_a_lead_goes_to_every_source_taking_its_kind(world) -> None:
    catalog, *_ = world
    item = _item(normalize_lead("email", "bob@example.com"), sources=None)
    requests, skipped = run_requests_for(item, catalog)
    assert sorted(r.job_name for r in requests) == sorted(job_name(s.name) for s in catalog.for_kind("email"))
    assert skipped == []


def test_a_wanted_source_that_cannot_take_the_lead_is_skipped_with_a_reason(world) -> None:
    catalog, *_ = world
    item = _item(normalize_lead("email", "bob@example.com"), sources=["robust", "flaky", "gone"])
    requests, skipped = run_requests_for(item, catalog)
    assert [r.job_name for r in requests] == [job_name("robust")]
    assert any("flaky: does not take email" in s for s in skipped)
    assert any("gone: no longer in sources.yaml" in s for s in skipped)


def test_backfill_priority_class_maps_to_a_lower_dagster_priority(world) -> None:
    catalog, *_ = world
    item = _item(normalize_lead("domain", "example.com"), sources=["robust"], priority="backfill")
    (request,), _ = run_requests_for(item, catalog)
    assert int(request.tags["dagster/priority"]) < DAGSTER_PRIORITY[PriorityClass.INTERACTIVE]


def _item(lead, *, sources, priority="interactive") -> InboxItem:
    from datetime import UTC, datetime

    return InboxItem(id=7, webhook_id="w", case_id="c", lead=lead, sources=sources, priority_class=priority,
                     received_at=datetime.now(UTC))
