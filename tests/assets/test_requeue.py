"""Dead letters requeued from the UI's Launchpad: the same filters as the CLI, validated."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance

from assets.requeue import REQUEUE_JOB
from definitions import build_definitions
from investigations.config import Settings
from investigations.store import StateStore


@pytest.fixture
def world(sandbox_env):
    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    for source, lead, reason in (("flaky", "l1", "transient"), ("flaky", "l2", "blocked"), ("robust", "l3", "transient")):
        store.put_dead_letter(source=source, lead_id=lead, reason_group=reason, last_status=503, attempts=4,
                              last_error="HTTP 503")
    yield build_definitions(settings).resolve_job_def(REQUEUE_JOB), store
    store.close()


def _run(job, **config):
    return job.execute_in_process(instance=DagsterInstance.ephemeral(), raise_on_error=False,
                                  run_config={"ops": {"requeue_matching_dead_letters": {"config": config}}})


def test_the_job_requeues_the_matching_dead_letters_once(world) -> None:
    job, store = world
    result = _run(job, source="flaky", reason="transient")
    assert result.success
    assert store.requeued_dead_letters() == {("flaky", "l1")}
    again = _run(job, source="flaky", reason="transient")
    (event,) = [e for e in again.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert event.event_specific_data.metadata["requeued"].value == 0  # launched twice, queued once


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"source": "nosuch"}, "unknown source 'nosuch' (known: robust, fragile, flaky, quiet, slow, changing)"),
        ({"reason": "bogus"}, "unknown reason 'bogus' (known: throttled,"),
        ({}, "say which dead letters to requeue"),
        ({"lead": "domain:not a domain"}, "lead 'domain:not a domain'"),
    ],
)
def test_bad_filters_fail_the_run_naming_the_valid_choices_and_requeue_nothing(world, config, says) -> None:
    job, store = world
    result = _run(job, **config)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert says in failure.event_specific_data.error.message or says in str(failure.event_specific_data.error)
    assert store.requeued_dead_letters() == set()
