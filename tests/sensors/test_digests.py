"""The case digest sensor posts one Slack message per case with news in the period that ended, none
for a case without news, and nothing again for the same period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dagster import DagsterInstance, build_sensor_context

from investigations.adapters import ParsedRecord
from investigations.config import Settings
from investigations.evidence.records import RecordStore
from investigations.fleet.digest import window
from investigations.intake.leads import normalize_lead
from investigations.store import StateStore
from resources.fleet import FleetResource
from resources.slack import FleetSlack
from sensors.digests import build_case_digest_sensor
from tests.fakes import FakeSlack

PERIOD_S = 3600.0


@pytest.fixture
def world(sandbox_env: Path):
    store = StateStore.from_url(Settings.from_env().database_url)
    slack = FakeSlack()
    yield store, RecordStore(Settings.from_env().records_dir), slack
    slack.close()
    store.close()


def _tick(slack: FakeSlack, cursor: str | None) -> str | None:
    sensor = build_case_digest_sensor(period_s=PERIOD_S)
    with DagsterInstance.ephemeral() as instance, build_sensor_context(instance=instance, cursor=cursor, resources={
            "fleet": FleetResource(), "slack": FleetSlack(token="xoxb-test", channel="#cases", api_url=slack.url)}
            ) as context:
        sensor(context)
        return context.cursor


def test_one_digest_per_case_with_news_and_none_again_for_the_same_period(world) -> None:
    store, records, slack = world
    last_start = datetime.fromtimestamp((window(datetime.now(UTC).timestamp(), PERIOD_S) - 1) * PERIOD_S, UTC)
    busy, quiet = normalize_lead("domain", "example.com"), normalize_lead("domain", "calm.example")
    store.add_lead(busy, case_id="case-busy")
    store.add_lead(quiet, case_id="case-calm")
    records.write("robust", busy.id, [ParsedRecord("a", None, {"v": 1})], fetched_at=last_start - timedelta(hours=5))
    records.write("robust", busy.id, [ParsedRecord("a", None, {"v": 1}), ParsedRecord("cert-9", None, {"v": 2})],
                  fetched_at=last_start + timedelta(minutes=10))
    records.write("robust", quiet.id, [ParsedRecord("z", None, {"v": 3})],  # a first collection: no news
                  fetched_at=last_start + timedelta(minutes=20))
    cursor = _tick(slack, None)
    (text,) = slack.texts()
    assert "*case-busy*" in text and "+1 added (cert-9)" in text and slack.messages[0]["channel"] == "#cases"
    _tick(slack, cursor)
    assert len(slack.texts()) == 1  # that period is digested
