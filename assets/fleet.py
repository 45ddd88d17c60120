"""Fleet-wide assets: what the fleet knows about itself, shown where investigators already look."""

from collections import Counter
from typing import Any

from dagster import AssetKey, AssetSelection, MaterializeResult, MetadataValue, asset, define_asset_job

from investigations.fleet.stats import NUMERIC_FIGURES, fleet_figures
from investigations.pacing import Circuits
from resources.fleet import FleetResource

FLEET_GROUP = "fleet"
DEAD_LETTERS_KEY = AssetKey(["fleet", "dead_letters"])
HEALTH_KEY = AssetKey(["fleet", "health"])
FLEET_REPORT_JOB = "fleet_report"
FLEET_HEALTH_JOB = "fleet_health"
NEWEST_SHOWN = 25


@asset(key=DEAD_LETTERS_KEY, group_name=FLEET_GROUP, kinds={"sql"})
def dead_letters(fleet: FleetResource) -> MaterializeResult:
    """Collections that gave up, grouped by reason and source, newest first.

    Requeue with `investigations dlq requeue --source S --reason R` (idempotent); a requeued letter
    stays listed, marked, until its collection succeeds.
    """
    letters = fleet.store.dead_letters()
    requeued = fleet.store.requeued_dead_letters()
    by_reason = Counter(letter.reason_group for letter in letters)
    by_source = Counter(letter.source for letter in letters)
    rows = ["| source | lead | reason | last status | attempts | last seen | requeued | last error |",
            "|---|---|---|---|---|---|---|---|"]
    for letter in letters[:NEWEST_SHOWN]:
        error = (letter.last_error or "").replace("|", "/")[:120]
        rows.append(
            f"| {letter.source} | {letter.lead_id} | {letter.reason_group} | {letter.last_status or '-'} | "
            f"{letter.attempts} | {letter.last_seen.isoformat(timespec='seconds')} | "
            f"{'yes' if (letter.source, letter.lead_id) in requeued else ''} | {error} |"
        )
    return MaterializeResult(
        metadata={
            "total": len(letters),
            "requeued": sum(1 for letter in letters if (letter.source, letter.lead_id) in requeued),
            "by_reason": MetadataValue.json(dict(sorted(by_reason.items()))),
            "by_source": MetadataValue.json(dict(sorted(by_source.items()))),
            "newest": MetadataValue.md("\n".join(rows) if letters else "No dead letters."),
        }
    )


def fleet_health_metadata(fleet: FleetResource) -> dict[str, Any]:
    """Each source's health verdict and fleet figures, as fleet/health's metadata.

    One numeric entry per source and figure (`robust/records_per_min`, ...), so the UI plots each
    over time; a figure without a value (a rate with no requests) is left out rather than plotted
    as 0. The verdicts and their reasons are in `health` (the same as `investigations fleet`)."""
    store = fleet.store
    circuits = {source: state.state for source, state in Circuits(store).all_states().items()}
    figures = fleet_figures(store, fleet.catalog, circuits=circuits, data_dir=fleet.settings().data_dir)
    metadata: dict[str, Any] = {}
    for f in figures:
        metadata[f"{f.source}/health"] = f.health
        for name in NUMERIC_FIGURES:
            value = getattr(f, name)
            if value is not None:
                metadata[f"{f.source}/{name}"] = MetadataValue.float(float(value))
    rows = ["| source | health | why |", "|---|---|---|"]
    rows += [f"| {f.source} | {f.health} | {f.health_reason or '-'} |" for f in figures]
    unhealthy = sorted(f.source for f in figures if f.health not in ("ok", "idle"))
    return {
        "unhealthy": MetadataValue.json(unhealthy),
        "health": MetadataValue.md("\n".join(rows)),
        **metadata,
    }


@asset(key=HEALTH_KEY, group_name=FLEET_GROUP, kinds={"sql"})
def fleet_health(fleet: FleetResource) -> MaterializeResult:
    """Each source's health verdict and fleet figures (`fleet_health_metadata`).

    The `fleet_health_every_minute` sensor reports these figures once a minute without a run;
    materializing the asset (from the UI, say) refreshes them at once."""
    return MaterializeResult(metadata=fleet_health_metadata(fleet))


fleet_report_job = define_asset_job(
    FLEET_REPORT_JOB,
    selection=AssetSelection.assets(DEAD_LETTERS_KEY),
    description="Refresh the fleet's dead-letter asset.",
)

fleet_health_job = define_asset_job(
    FLEET_HEALTH_JOB,
    selection=AssetSelection.assets(HEALTH_KEY),
    description="Refresh fleet/health: each source's verdict and figures.",
)
