"""Tell operators in Slack, once per incident: a source whose answers fail their checks, a failing
source-level check (stale, canary, refusals, volume), a circuit opening, new dead letters.

Conditions are read from Dagster's own check records and from the state store each tick; which of
them are new is decided by `investigations.fleet.alerts` against what the cursor remembers, so a source
that stays broken is announced once (and its recovery once).
"""

from __future__ import annotations

from dagster import (
    AssetCheckKey,
    DagsterInstance,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from assets.health import source_check_specs
from assets.naming import EMPTY_CHECK_NAME, source_asset_key
from investigations.fleet.alerts import AlertState, Condition, asset_path, due_alerts, new_dead_letters, remembered
from investigations.pacing import Circuits
from investigations.sources.specs import SourceCatalog
from resources.dagster_internals import AssetCheckExecutionRecordStatus
from resources.fleet import FleetResource
from resources.slack import FleetSlack

INTERVAL_S = 30


def conditions(instance: DagsterInstance, fleet: FleetResource, catalog: SourceCatalog) -> dict[str, Condition]:
    """Every alert condition raised now, by key."""
    raised: dict[str, Condition] = {}
    for spec in catalog.sources:
        key = AssetCheckKey(source_asset_key(spec.name), EMPTY_CHECK_NAME)
        failing = [info.partition_key for info in instance.event_log_storage.get_asset_check_partition_info([key])
                   if info.is_current and info.latest_execution_status == AssetCheckExecutionRecordStatus.FAILED]
        if failing:
            raised[f"answers:{spec.name}"] = Condition(
                f"answers:{spec.name}", spec.name,
                f"{len(failing)} lead(s) failing `{EMPTY_CHECK_NAME}` (empty, short or missing fields), "
                f"e.g. {failing[0]}", asset_path(spec.name))
    keys = [check.key for check in source_check_specs(catalog)]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    for key, record in latest.items():
        if record.status != AssetCheckExecutionRecordStatus.FAILED or record.event is None:
            continue
        source = key.asset_key.path[-1]
        evaluation = record.event.dagster_event.event_specific_data if record.event.dagster_event else None
        why = getattr(evaluation, "description", None) or "failed"
        raised[f"check:{source}:{key.name}"] = Condition(
            f"check:{source}:{key.name}", source, f"`{key.name}` failed: {why}", asset_path(source))
    for source, state in Circuits(fleet.store).all_states().items():
        if state.state == "open":
            raised[f"circuit:{source}"] = Condition(
                f"circuit:{source}", source, f"circuit open after {state.failure_streak} failures in a row "
                "(collections of it wait)", asset_path(source, view="events"))
    return raised


def build_slack_alerts_sensor(catalog: SourceCatalog, *, ui_url: str) -> SensorDefinition:
    @sensor(name="alert_operators_in_slack", minimum_interval_seconds=INTERVAL_S,
            default_status=DefaultSensorStatus.RUNNING,
            description="Posts to Slack once per incident: failing answers or source checks, circuits "
                        "opening, new dead letters.")
    def alert_operators_in_slack(context: SensorEvaluationContext, fleet: FleetResource,
                                 slack: FleetSlack) -> SkipReason:
        state = AlertState.read(context.cursor)
        raised = conditions(context.instance, fleet, catalog)
        alerts = due_alerts(raised, state.raised, ui_url=ui_url)
        letters = [(letter.source, letter.reason_group, letter.first_seen) for letter in fleet.store.dead_letters()]
        fresh = new_dead_letters(letters, since=state.dead_letters_since)
        client = slack.get_client()
        failed: set[str] = set()
        posted = 0
        for alert in alerts:
            try:
                client.chat_postMessage(channel=slack.channel, text=alert.text)
                posted += 1
            except Exception as exc:  # noqa: BLE001 - Slack down: announce it again next tick
                failed.add(alert.key)
                context.log.warning(f"could not post the alert {alert.key} to Slack: {type(exc).__name__}")
        letters_ok = True
        for source, (count, reason) in fresh.items():
            try:
                client.chat_postMessage(
                    channel=slack.channel,
                    text=f":envelope: *{source}*: {count} new dead letter(s), newest: {reason}. "
                         f"Requeue with `investigations dlq requeue --source {source}` "
                         f"<{ui_url.rstrip('/')}/assets/fleet/dead_letters|dead letters in Dagster>")
                posted += 1
            except Exception as exc:  # noqa: BLE001
                letters_ok = False
                context.log.warning(f"could not post {source}'s dead letters to Slack: {type(exc).__name__}")
        newest = max((at for _, _, at in letters), default=state.dead_letters_since)
        context.update_cursor(AlertState(remembered(raised, state.raised, failed),
                                         newest if letters_ok else state.dead_letters_since).write())
        return SkipReason(f"{posted} message(s) posted, {len(failed)} failed; {len(raised)} condition(s) raised")

    return alert_operators_in_slack
