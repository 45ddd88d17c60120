"""The one place the fleet's Dagster `Definitions` is built (workspace.yaml and pyproject load it)."""

from __future__ import annotations

import os

from dagster import Definitions, EnvVar, in_process_executor

from assets.fleet import build_source_health_assets, dead_letters, fleet_health, fleet_health_job, fleet_report_job
from assets.health import build_source_health_checks, build_source_health_schedule
from assets.jobs import build_source_job
from assets.requeue import requeue_dead_letters_job
from assets.sources import build_source_asset
from investigations.config import Settings
from investigations.sources.catalog import load_catalog
from resources.dagster_internals import read_migration_scripts_once
from resources.fleet import FleetResource
from resources.identities import IdentityPoolResource
from resources.slack import SLACK_API_URL, FleetSlack
from sensors.alerts import build_slack_alerts_sensor
from sensors.dead_letters import dead_letter_report
from sensors.dead_runs import build_dead_runs_sensor
from sensors.digests import build_case_digest_sensor
from sensors.fleet_health import fleet_health_every_minute
from sensors.new_leads import build_new_lead_sensors
from sensors.partition_status import build_partition_status_sensor
from sensors.recurring import build_recurring_sensor

# Set to post alerts to Slack (see sensors/alerts.py); unset, no alert sensor is defined.
SLACK_TOKEN_ENV = "INVESTIGATIONS_SLACK_TOKEN"


def build_definitions(settings: Settings | None = None) -> Definitions:
    settings = settings or Settings.from_env()
    catalog = load_catalog(settings.sources_path)
    jobs = [build_source_job(spec) for spec in catalog.sources]
    # The proxy resource: identity leases from the shared pool. The fleet's collections go out
    # through it, so the UI shows the source assets using it.
    identities = IdentityPoolResource()
    resources: dict[str, object] = {"fleet": FleetResource(identities=identities), "identities": identities}
    alerts = []
    if os.environ.get(SLACK_TOKEN_ENV):
        # The token stays an EnvVar: Dagster reads it when the sensor runs, and shows only its name.
        resources["slack"] = FleetSlack(token=EnvVar(SLACK_TOKEN_ENV),
                                        channel=os.environ.get("INVESTIGATIONS_SLACK_CHANNEL") or "#investigations",
                                        api_url=os.environ.get("INVESTIGATIONS_SLACK_API_URL") or SLACK_API_URL)
        alerts.append(build_slack_alerts_sensor(catalog, ui_url=settings.ui_url))
        alerts.append(build_case_digest_sensor(period_s=settings.digest_period_s))
    return Definitions(
        assets=[*(build_source_asset(spec) for spec in catalog.sources), dead_letters, fleet_health,
                *build_source_health_assets(catalog)],
        asset_checks=[build_source_health_checks(catalog)],
        jobs=[*jobs, fleet_report_job, fleet_health_job, requeue_dead_letters_job],
        schedules=[build_source_health_schedule(catalog)],
        sensors=[*build_new_lead_sensors(catalog, jobs, retire_after_s=settings.retire_after_s),
                 build_recurring_sensor(catalog, jobs, interval_s=settings.recurring_every_s), dead_letter_report,
                 build_dead_runs_sensor(), fleet_health_every_minute, build_partition_status_sensor(catalog), *alerts],
        resources=resources,
        # One lead per run does little work; the in-process executor halves each run's overhead.
        executor=in_process_executor,
    )


# The code server opens a Dagster instance for every sensor tick, and a run worker one per run: each
# opening re-read Dagster's migration scripts (resources/dagster_internals.py). Read them once.
read_migration_scripts_once()
defs = build_definitions()
