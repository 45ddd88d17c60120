"""Refresh fleet/health every minute, so its figures plot as time series in the UI."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from assets.fleet import fleet_health_job
from investigations.priority import PriorityClass, run_tags

# Every minute: the figures' window is 15 min, so a point a minute shows a trend, while a run (a
# second or two of CPU) takes a few per cent of a small machine.
FLEET_HEALTH_CRON = "* * * * *"

fleet_health_schedule = ScheduleDefinition(
    name="fleet_health_every_minute",
    cron_schedule=FLEET_HEALTH_CRON,
    execution_timezone="UTC",
    job=fleet_health_job,
    # Background tags: the run queue keeps interactive headroom free of it, like any background run.
    tags=run_tags(PriorityClass.RECURRING),
    default_status=DefaultScheduleStatus.RUNNING,
    description="Materializes fleet/health (per-source verdicts and figures) once a minute.",
)
