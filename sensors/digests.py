"""One Slack digest per case and period: the findings that changed in its leads (`investigations
changes --case ID` lists the same), never sent for a period without news.

Periods are aligned to UTC (`INVESTIGATIONS_DIGEST_PERIOD`, a day by default). At each tick the
sensor digests the last period that ended and not yet digested, case by case, and moves its cursor
past it only when every digest of it was posted: a digest Slack refused goes again at the next tick
(one already posted is not, the cursor remembers which)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from dagster import DefaultSensorStatus, SensorDefinition, SensorEvaluationContext, SkipReason, sensor

from investigations.evidence.records import RecordStore
from investigations.fleet.digest import case_digest, window
from resources.fleet import FleetResource
from resources.slack import FleetSlack

DIGEST_SENSOR = "case_digests_in_slack"
INTERVAL_S = 300


def build_case_digest_sensor(*, period_s: float) -> SensorDefinition:
    @sensor(name=DIGEST_SENSOR, minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
            description="Posts one Slack digest per active case and period with the findings that changed in "
                        "its leads (records added, removed, changed; a lead's first records are not news); "
                        "nothing for a period without news.")
    def case_digests_in_slack(context: SensorEvaluationContext, fleet: FleetResource, slack: FleetSlack
                              ) -> SkipReason:
        now_s = datetime.now(UTC).timestamp()
        last = window(now_s, period_s) - 1  # the last period that ended
        state: dict[str, Any] = json.loads(context.cursor) if context.cursor else {"window": last - 1, "posted": []}
        if int(state["window"]) >= last:
            return SkipReason(f"the period that ended last ({last}) is digested already")
        # Only the last period that ended: after a pause, older periods are not digested one by one.
        todo = last
        posted_before = list(state.get("posted", [])) if int(state["window"]) == todo - 1 else []
        start, end = (datetime.fromtimestamp(w * period_s, UTC) for w in (todo, todo + 1))
        store, changes = fleet.store, RecordStore(fleet.settings().records_dir).changes
        client, posted, failed = slack.get_client(), posted_before, 0
        for case in store.cases_overview():
            if case["status"] != "active" or case["case_id"] in posted:
                continue
            lead_ids = store.case_lead_ids(case["case_id"]) or []
            leads = {lead.id: f"{lead.kind}:{lead.value}" for lead_id in lead_ids
                     if (lead := store.get_lead(lead_id)) is not None}
            text = case_digest(case["case_id"], changes.read(lead_ids, since=start), leads=leads, start=start, end=end)
            if text is None:
                continue
            try:
                client.chat_postMessage(channel=slack.channel, text=text)
                posted.append(case["case_id"])
            except Exception as exc:  # noqa: BLE001 - Slack down: this case's digest goes again next tick
                failed += 1
                context.log.warning(f"could not post case {case['case_id']}'s digest to Slack: {type(exc).__name__}")
        done = failed == 0
        context.update_cursor(json.dumps({"window": todo if done else todo - 1, "posted": [] if done else posted}))
        return SkipReason(f"period {start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC: {len(posted)} digest(s) posted, "
                          f"{failed} failed")

    return case_digests_in_slack
