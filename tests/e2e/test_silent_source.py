"""End to end with a real daemon: a silently empty source is flagged where operators look (its
partition check, Slack once, fleet/health)."""

from __future__ import annotations

import time

import pytest
from dagster import AssetCheckKey

from assets.fleet import HEALTH_KEY, source_health_key
from assets.naming import EMPTY_CHECK_NAME, source_asset_key
from investigations.demo.case import send_case
from investigations.intake.leads import normalize_lead
from resources.dagster_internals import AssetCheckExecutionRecordStatus
from sensors.alerts import INTERVAL_S
from sensors.fleet_health import INTERVAL_S as HEALTH_INTERVAL_S

pytestmark = pytest.mark.e2e


def test_a_silently_empty_source_fails_its_partition_check_and_slack_hears_once(fleet) -> None:
    from tests.e2e.conftest import SECRET, SLACK_TOKEN, wait_for

    lead = normalize_lead("domain", "silent-source.example")
    answer = send_case(fleet.intake_url, SECRET, {"case_id": "case-silent", "sources": ["quiet"],
                                                  "leads": [lead.as_dict()]}, webhook_id="msg_silent_1")
    assert answer.status_code == 202, answer.text
    key = AssetCheckKey(source_asset_key("quiet"), EMPTY_CHECK_NAME)

    def failed_partitions() -> set[str]:
        infos = fleet.instance.event_log_storage.get_asset_check_partition_info([key])
        return {i.partition_key for i in infos
                if i.is_current and i.latest_execution_status == AssetCheckExecutionRecordStatus.FAILED}

    wait_for(lambda: lead.partition_key in failed_partitions(), timeout_s=120, what="quiet's check failed on the lead")

    def quiet_alerts() -> list[dict]:
        return [m for m in fleet.slack.messages if "*quiet*" in m.get("text", "") and EMPTY_CHECK_NAME in m["text"]]

    (message,) = wait_for(quiet_alerts, timeout_s=INTERVAL_S + 60, what="a Slack message about quiet")
    assert message["channel"] == "#fleet-e2e" and message["authorization"] == f"Bearer {SLACK_TOKEN}"
    time.sleep(INTERVAL_S + 5)  # the sensor's next tick: the source is still silent, nothing new to say
    assert len(quiet_alerts()) == 1

    def health_says_quiet_is_empty():
        event = fleet.instance.get_latest_materialization_event(source_health_key("quiet"))
        metadata = event.asset_materialization.metadata if event else {}
        return event if "health" in metadata and metadata["health"].value == "empty" else None

    health = wait_for(health_says_quiet_is_empty, timeout_s=HEALTH_INTERVAL_S + 30,
                      what="fleet/sources/quiet: empty")
    assert health.run_id == ""  # reported by the fleet_health sensor's tick: no run was started for it
    assert health.asset_materialization.metadata["empty_rate"].value > 0  # the figure the docs say to watch
    overview = fleet.instance.get_latest_materialization_event(HEALTH_KEY).asset_materialization
    assert "quiet" in overview.metadata["unhealthy"].value
    logs = "".join(p.read_text(errors="replace") for p in fleet.logs.glob("*.log"))
    assert SLACK_TOKEN not in logs
