"""Slack alerts: posted through dagster-slack to a local Slack Web API, once per incident."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from dagster import DagsterInstance, build_sensor_context, materialize

from assets.sources import build_source_asset
from investigations.config import Settings
from investigations.intake.leads import normalize_lead
from investigations.sources.catalog import load_catalog
from investigations.store import StateStore
from resources.fleet import FleetResource
from resources.slack import FleetSlack
from sensors.alerts import build_slack_alerts_sensor
from tests.fakes import FakeSlack

TOKEN = "xoxb-1234-secret-token"


@pytest.fixture
def world(sandbox_env: Path, sandbox):
    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    catalog = load_catalog(settings.sources_path)
    instance = DagsterInstance.ephemeral()
    slack = FakeSlack()
    yield sandbox, catalog, store, instance, slack
    slack.close()
    store.close()


def _collect(catalog, instance, source, lead) -> None:
    instance.add_dynamic_partitions("leads", [lead.id])
    materialize([build_source_asset(catalog.get(source))], partition_key=lead.id, instance=instance,
                resources={"fleet": FleetResource()})


def _tick(catalog, instance, slack: FakeSlack, cursor: str | None):
    sensor = build_slack_alerts_sensor(catalog, ui_url="http://ui.test:3000")
    with build_sensor_context(instance=instance, cursor=cursor, resources={
            "fleet": FleetResource(), "slack": FleetSlack(token=TOKEN, channel="#ops", api_url=slack.url)}) as context:
        result = sensor(context)
        return context.cursor, result


def test_a_silently_empty_source_is_announced_once_and_its_recovery_once(world) -> None:
    sandbox, catalog, store, instance, slack = world
    lead = normalize_lead("domain", "example.com")
    store.add_lead(lead, case_id="case-1")
    _collect(catalog, instance, "quiet", lead)
    cursor, _ = _tick(catalog, instance, slack, None)
    (text,) = slack.texts()
    assert "*quiet*" in text and "not_silently_empty" in text
    assert "http://ui.test:3000/assets/sources/quiet?view=checks" in text
    assert slack.messages[0]["channel"] == "#ops" and slack.messages[0]["authorization"] == f"Bearer {TOKEN}"
    cursor, _ = _tick(catalog, instance, slack, cursor)
    assert len(slack.texts()) == 1  # still failing: nothing new to say
    httpx.post(f"{sandbox.url}/_control/quiet", json={"empty": False}).raise_for_status()
    try:
        _collect(catalog, instance, "quiet", lead)
    finally:  # the sandbox is shared by the session
        httpx.post(f"{sandbox.url}/_control/quiet", json={"empty": True}).raise_for_status()
    cursor, _ = _tick(catalog, instance, slack, cursor)
    assert len(slack.texts()) == 2 and "resolved" in slack.texts()[1] and "*quiet*" in slack.texts()[1]
    assert TOKEN not in (cursor or "")


def test_an_alert_slack_refused_is_posted_on_the_next_tick(world) -> None:
    _, catalog, store, instance, slack = world
    lead = normalize_lead("domain", "example.com")
    store.add_lead(lead, case_id="case-1")
    _collect(catalog, instance, "quiet", lead)
    slack.failing = True
    cursor, _ = _tick(catalog, instance, slack, None)
    assert slack.texts() == []
    slack.failing = False
    _tick(catalog, instance, slack, cursor)
    assert len(slack.texts()) == 1


def test_new_dead_letters_post_one_message_per_source(world) -> None:
    _, catalog, store, instance, slack = world
    for i in range(3):
        store.put_dead_letter(source="flaky", lead_id=f"l{i}", reason_group="transient", last_status=503,
                              attempts=4, last_error="HTTP 503")
    cursor, _ = _tick(catalog, instance, slack, None)
    (text,) = slack.texts()
    assert "*flaky*" in text and "3 new dead letter(s)" in text
    _tick(catalog, instance, slack, cursor)
    assert len(slack.texts()) == 1
