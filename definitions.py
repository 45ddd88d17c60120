"""The one place the fleet's Dagster `Definitions` is built (workspace.yaml and pyproject load it)."""

from __future__ import annotations

from dagster import Definitions, in_process_executor

from assets.fleet import dead_letters, fleet_health, fleet_health_job, fleet_report_job
from assets.jobs import build_source_job
from assets.sources import build_source_asset
from investigations.catalog import load_catalog
from investigations.config import Settings
from resources.fleet import FleetResource
from sensors.dead_letters import dead_letter_report
from sensors.dead_runs import build_dead_runs_sensor
from sensors.fleet_health import fleet_health_schedule
from sensors.new_leads import build_new_lead_sensors
from sensors.recurring import build_recurring_sensor


def build_definitions(settings: Settings | None = None) -> Definitions:
    settings = settings or Settings.from_env()
    catalog = load_catalog(settings.sources_path)
    jobs = [build_source_job(spec) for spec in catalog.sources]
    return Definitions(
        assets=[*(build_source_asset(spec) for spec in catalog.sources), dead_letters, fleet_health],
        jobs=[*jobs, fleet_report_job, fleet_health_job],
        schedules=[fleet_health_schedule],
        sensors=[*build_new_lead_sensors(catalog, jobs), build_recurring_sensor(catalog, jobs), dead_letter_report,
                 build_dead_runs_sensor()],
        resources={"fleet": FleetResource()},
        # One lead per run does little work; the in-process executor halves each run's overhead.
        executor=in_process_executor,
    )


defs = build_definitions()
