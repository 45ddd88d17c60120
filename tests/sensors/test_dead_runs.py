"""A run that ended for good gives the leads it still owed back to the queue; a run being retried keeps them."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, SensorResult, build_sensor_context

from assets.naming import job_name
from investigations.scheduling.priority import HANDOVER_TAG
from investigations.store import StateStore
from resources.fleet import FleetResource
from sensors.dead_runs import build_dead_runs_sensor


@pytest.fixture
def world(sandbox_env):
    store = StateStore.from_url(f"sqlite:///{sandbox_env / 'state.db'}")
    yield store, DagsterInstance.ephemeral()
    store.close()


def _handed_over(store, lead, key):
    store.enqueue([("robust", lead)], origin=f"inbox:{lead}", priority_class="interactive")
    (row,) = store.dispatch("robust", limit=1)
    store.assign_handover([row.id], handover_key=key)


def _ended_run(instance, key, status, **tags):
    run = DagsterRun(job_name=job_name("robust"), status=status, tags={HANDOVER_TAG: key, **tags})
    instance.add_run(run)
    return run


def _tick(instance, cursor=None) -> SensorResult:
    with build_sensor_context(instance=instance, cursor=cursor, resources={"fleet": FleetResource()}) as context:
        return build_dead_runs_sensor()(context)


def test_a_failed_run_s_leads_go_back_to_the_queue_and_a_retried_one_s_stay_with_the_retry(world) -> None:
    store, instance = world
    _handed_over(store, "domain-dead", "k-dead")
    _handed_over(store, "domain-retried", "k-retried")
    _handed_over(store, "domain-running", "k-running")
    _ended_run(instance, "k-dead", DagsterRunStatus.FAILURE)
    _ended_run(instance, "k-retried", DagsterRunStatus.FAILURE, **{"dagster/will_retry": "true"})
    instance.add_run(DagsterRun(job_name=job_name("robust"), status=DagsterRunStatus.STARTED,
                                tags={HANDOVER_TAG: "k-running"}))
    result = _tick(instance)
    assert store.handover_leads("k-dead") == []
    assert store.handover_leads("k-retried") == ["domain-retried"]
    assert store.handover_leads("k-running") == ["domain-running"]
    assert store.queue_depths()["robust"]["ready"] == 1
    assert "1 requeued" in result.skip_reason.skip_message


def test_a_canceled_run_gives_its_leads_back_once(world) -> None:
    store, instance = world
    _handed_over(store, "domain-1", "k-1")
    _ended_run(instance, "k-1", DagsterRunStatus.CANCELED)
    first = _tick(instance)
    again = _tick(instance, cursor=None)  # read from the start again: nothing twice
    assert "1 requeued" in first.skip_reason.skip_message and "nothing owed" in again.skip_reason.skip_message
    assert store.queue_depths()["robust"]["ready"] == 1


def test_rows_whose_run_was_never_created_go_back_and_those_of_a_live_run_stay(world) -> None:
    from datetime import timedelta

    from investigations.scheduling.dispatch import ORPHANED_DISPATCH
    from investigations.store import utcnow

    store, instance = world
    claimed = utcnow() - ORPHANED_DISPATCH - timedelta(seconds=5)  # by a tick the daemon died in
    for lead, key in (("domain-orphan", "k-orphan"), ("domain-live", "k-live")):
        store.enqueue([("robust", lead)], origin=f"inbox:{lead}", priority_class="interactive", now=claimed)
        (row,) = store.dispatch("robust", limit=1, now=claimed)
        store.assign_handover([row.id], handover_key=key)
    instance.add_run(DagsterRun(job_name=job_name("robust"), status=DagsterRunStatus.NOT_STARTED,
                                tags={HANDOVER_TAG: "k-live"}))
    result = _tick(instance)
    assert store.handover_leads("k-orphan") == [] and store.handover_leads("k-live") == ["domain-live"]
    assert store.queue_depths()["robust"]["ready"] == 1
    assert "1 dispatched collection(s) no run owns" in result.skip_reason.skip_message


def test_a_failed_run_not_yet_marked_for_retry_or_not_keeps_its_leads_until_it_is(sandbox_env) -> None:
    store = StateStore.from_url(f"sqlite:///{sandbox_env / 'state.db'}")
    instance = DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True}})
    try:
        _handed_over(store, "domain-1", "k-1")
        run = _ended_run(instance, "k-1", DagsterRunStatus.FAILURE)  # the will_retry tag is not there yet
        first = _tick(instance)
        assert store.handover_leads("k-1") == ["domain-1"]
        instance.add_run_tags(run.run_id, {"dagster/will_retry": "false"})
        _tick(instance, cursor=first.cursor)
        assert store.handover_leads("k-1") == [] and store.queue_depths()["robust"]["ready"] == 1
    finally:
        store.close()


def _claimed_long_ago(store, lead, key):
    from datetime import timedelta

    from investigations.scheduling.dispatch import ORPHANED_DISPATCH
    from investigations.store import utcnow

    claimed = utcnow() - ORPHANED_DISPATCH - timedelta(seconds=5)
    store.enqueue([("robust", lead)], origin=f"inbox:{lead}", priority_class="interactive", now=claimed)
    (row,) = store.dispatch("robust", limit=1, now=claimed)
    store.assign_handover([row.id], handover_key=key)


def test_a_promised_retry_that_never_comes_gives_the_leads_back(world, monkeypatch: pytest.MonkeyPatch) -> None:
    import sensors.dead_runs as dead_runs

    store, instance = world
    _claimed_long_ago(store, "domain-promised", "k-promised")
    _ended_run(instance, "k-promised", DagsterRunStatus.FAILURE, **{"dagster/will_retry": "true"})
    first = _tick(instance)
    assert store.handover_leads("k-promised") == ["domain-promised"]  # the retry may still come
    monkeypatch.setattr(dead_runs, "RETRY_PROMISE_S", 0.0)  # ... and now it is overdue
    result = _tick(instance, cursor=first.cursor)
    assert store.handover_leads("k-promised") == [] and store.queue_depths()["robust"]["ready"] == 1
    assert "a retry that never came" in result.skip_reason.skip_message


def test_a_promised_retry_that_came_keeps_the_leads_with_it(world, monkeypatch: pytest.MonkeyPatch) -> None:
    import sensors.dead_runs as dead_runs

    store, instance = world
    _claimed_long_ago(store, "domain-retried", "k-retried")
    _ended_run(instance, "k-retried", DagsterRunStatus.FAILURE, **{"dagster/will_retry": "true"})
    instance.add_run(DagsterRun(job_name=job_name("robust"), status=DagsterRunStatus.NOT_STARTED,
                                tags={HANDOVER_TAG: "k-retried"}))  # the retry, same handover
    monkeypatch.setattr(dead_runs, "RETRY_PROMISE_S", 0.0)
    _tick(instance)
    assert store.handover_leads("k-retried") == ["domain-retried"]
