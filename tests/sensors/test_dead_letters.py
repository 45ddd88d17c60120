"""The dead-letter report sensor refreshes the asset only when the dead letters changed."""

from __future__ import annotations

from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context

from investigations.config import Settings
from investigations.store import StateStore
from resources.fleet import FleetResource
from sensors.dead_letters import dead_letter_report


def _tick(instance, cursor):
    with build_sensor_context(instance=instance, cursor=cursor, resources={"fleet": FleetResource()}) as context:
        result = dead_letter_report(context)
        return result, context.cursor


def test_a_new_dead_letter_requests_one_refresh_then_the_sensor_skips(sandbox_env) -> None:
    instance = DagsterInstance.ephemeral()
    first, cursor = _tick(instance, None)
    assert isinstance(first, RunRequest)  # the first tick always shows the current state
    assert isinstance(_tick(instance, cursor)[0], SkipReason)
    StateStore.from_url(Settings.from_env().database_url).put_dead_letter(
        source="flaky", lead_id="l1", reason_group="transient", last_status=500, attempts=4, last_error="HTTP 500")
    changed, new_cursor = _tick(instance, cursor)
    assert isinstance(changed, RunRequest) and new_cursor != cursor
    assert isinstance(_tick(instance, new_cursor)[0], SkipReason)
