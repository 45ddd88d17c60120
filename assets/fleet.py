"""Fleet-wide assets: what the fleet knows about itself, shown where investigators already look."""

from collections import Counter

from dagster import AssetKey, AssetSelection, MaterializeResult, MetadataValue, asset, define_asset_job

from resources.fleet import FleetResource

FLEET_GROUP = "fleet"
DEAD_LETTERS_KEY = AssetKey(["fleet", "dead_letters"])
FLEET_REPORT_JOB = "fleet_report"
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


fleet_report_job = define_asset_job(
    FLEET_REPORT_JOB,
    selection=AssetSelection.groups(FLEET_GROUP),
    description="Refresh the fleet's own assets (dead letters).",
)
