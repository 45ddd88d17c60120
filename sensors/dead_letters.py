"""Refresh the dead-letter asset whenever the dead letters change, so the UI never shows a stale list."""

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from assets.fleet import fleet_report_job
from investigations.scheduling.priority import PriorityClass, run_tags
from resources.fleet import FleetResource

INTERVAL_S = 30


def dead_letter_fingerprint(fleet: FleetResource) -> str:
    letters = fleet.store.dead_letters()
    newest = max((letter.last_seen for letter in letters), default=None)
    requeued = len(fleet.store.requeued_dead_letters())
    return f"{len(letters)}:{newest.isoformat() if newest else '-'}:{requeued}"


@sensor(
    name="dead_letter_report",
    job=fleet_report_job,
    minimum_interval_seconds=INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Re-materializes fleet/dead_letters when a collection dead-letters, is requeued or recovers.",
)
def dead_letter_report(context: SensorEvaluationContext, fleet: FleetResource) -> RunRequest | SkipReason:
    fingerprint = dead_letter_fingerprint(fleet)
    if fingerprint == context.cursor:
        return SkipReason(f"dead letters unchanged ({fingerprint})")
    context.update_cursor(fingerprint)
    return RunRequest(
        run_key=f"dead-letters:{fingerprint}",
        tags=run_tags(PriorityClass.RECURRING),
    )
