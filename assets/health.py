"""Source-level checks: each source judged as a whole, on a schedule, where its catalog row shows it.

A lead's own check (`not_silently_empty`) runs with its collection. What no single lead shows runs
here, every few minutes, whether or not the source is collecting: freshness of the leads it
monitors, its canary leads, a spike of refusals, a drop of volume. The judgements are the engine's
(`investigations.fleet.degradation.judge_source`); this module only reports them to Dagster.
"""

from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSpec,
    AssetSelection,
    DefaultScheduleStatus,
    ScheduleDefinition,
    define_asset_job,
    multi_asset_check,
)

from assets.naming import SOURCE_CHECK_NAMES, source_asset_key
from assets.sources import severity_of, verdict_metadata
from investigations.fleet.degradation import judge_source
from investigations.scheduling.cost import spend_today
from investigations.sources.specs import SourceCatalog
from investigations.store.state import utcnow
from resources.fleet import FleetResource

SOURCE_HEALTH_JOB = "source_health"
SOURCE_HEALTH_CRON = "*/5 * * * *"

DESCRIPTIONS = {
    "fresh": "The share of the leads this source monitors collected with records within its cadence "
             "(an empty answer is not fresh), and the stalest.",
    "canaries": "The source's canary leads (known positives in sources.yaml) all yielded records.",
    "refusals": "The share of requests refused (blocked or throttled) in the last 15 minutes did not spike "
                "against the day before.",
    "volume": "Records per collection and the size of answers in the last hour did not drop against the "
              "week before.",
    "budget": "The source's spend today is under its daily_budget_usd (once spent, background work waits).",
}


def source_check_specs(catalog: SourceCatalog) -> list[AssetCheckSpec]:
    """Every source's checks (canaries only where the source names some)."""
    return [AssetCheckSpec(name, asset=source_asset_key(spec.name), description=DESCRIPTIONS[judgement])
            for spec in catalog.sources for judgement, name in SOURCE_CHECK_NAMES.items()
            if (judgement != "canaries" or spec.canaries) and (judgement != "budget" or spec.daily_budget_usd > 0)]


def build_source_health_checks(catalog: SourceCatalog) -> AssetChecksDefinition:
    specs = source_check_specs(catalog)

    @multi_asset_check(specs=specs, can_subset=True, name="judge_sources",
                       description="Each source judged as a whole: freshness, canaries, refusals, volume, budget.")
    def source_health(context: AssetCheckExecutionContext, fleet: FleetResource) -> Iterator[AssetCheckResult]:
        now = utcnow()
        spent = spend_today(fleet.store, catalog, now=now)
        selected = context.selected_asset_check_keys
        for spec in catalog.sources:
            key = source_asset_key(spec.name)
            wanted = {j: n for j, n in SOURCE_CHECK_NAMES.items() if AssetCheckKey(key, n) in selected}
            if not wanted:
                continue
            for judgement, verdict in judge_source(fleet.store, spec, now=now,
                                                   spent_today_usd=spent.get(spec.name, 0.0)).items():
                # Nothing to judge yet (no canary collected, no lead monitored): no result, so the
                # check reads as not evaluated, never Passed on no evidence.
                if judgement in wanted and verdict.judged:
                    yield AssetCheckResult(asset_key=key, check_name=wanted[judgement], passed=verdict.passed,
                                           severity=severity_of(verdict), description=verdict.description,
                                           metadata=verdict_metadata(verdict))

    return source_health


def build_source_health_schedule(catalog: SourceCatalog) -> ScheduleDefinition:
    job = define_asset_job(SOURCE_HEALTH_JOB, selection=AssetSelection.checks(*(spec.key for spec in source_check_specs(catalog))),
                           description="Judge every source as a whole (freshness, canaries, refusals, volume).")
    return ScheduleDefinition(name="source_health_every_5_minutes", job=job, cron_schedule=SOURCE_HEALTH_CRON,
                              default_status=DefaultScheduleStatus.RUNNING)
