"""Fleet-wide assets: what the fleet knows about itself, shown where investigators already look."""

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    define_asset_job,
)

from investigations.fleet.stats import NUMERIC_FIGURES, LaneStanding, SourceFigures, fleet_figures, lane_standings
from investigations.pacing import Circuits
from investigations.sources.specs import SourceCatalog
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


# Dagster's UI plots an asset's numeric metadata over time, but only its first this many keys: one
# asset for every source's figures stopped drawing at the fifth source (5 sources x 23 figures then).
UI_PLOTTED_KEYS = 100
# Fleet-wide sums plotted on fleet/health itself.
FLEET_SUMS = ("backlog", "in_flight", "requests_per_min", "records_per_min", "dead_letters", "spend_today_usd")
# A source's pacing, plotted besides its figures: its own lane's rate in use and learned ceiling, r/s.
PACING_FIGURES = ("rate_in_use_per_s", "ceiling_rate_per_s")
# The `pacing` table of a source: its own lane ("-") and each of its identities' lanes.
PACING_SCHEMA = TableSchema(columns=[
    TableColumn("identity", "string", description="the identity's lane at the source; -: the source's own lane"),
    TableColumn("configured_per_s", "float", description="the rate sources.yaml configures, r/s"),
    TableColumn("in_use_per_s", "float", description="the rate the lane sends at now (configured x its factor), r/s"),
    TableColumn("ceiling_per_s", "float", description="the learned ceiling: the rate the source last throttled the "
                                                      "lane at, r/s; empty if it never did"),
    TableColumn("ceiling_age_s", "int", description="seconds since the source throttled at the ceiling"),
])


HEALTHY_CHECK = "healthy"
# Verdicts that are not a problem: the source works, or has had nothing to do.
HEALTHY_VERDICTS = ("ok", "idle")


def source_health_key(source: str) -> AssetKey:
    """The asset that carries one source's verdict and figures: `fleet/sources/<source>`."""
    return AssetKey(["fleet", "sources", source])


def healthy_check(source: str, metadata: dict[str, Any]) -> AssetCheckEvaluation:
    """The source's `healthy` check from its figures: failed (ERROR) unless its verdict is ok or idle,
    with the verdict's reason, so the source's row and page show it as a failed check."""
    health = str(metadata.get("health", "unknown"))
    return AssetCheckEvaluation(
        asset_key=source_health_key(source), check_name=HEALTHY_CHECK, passed=health in HEALTHY_VERDICTS,
        severity=AssetCheckSeverity.ERROR,
        description=f"{source}: {health}" + (f" ({metadata['why']})" if metadata.get("why", "-") != "-" else ""),
        metadata={"health": MetadataValue.text(health), "why": MetadataValue.text(str(metadata.get("why", "-")))})


def fleet_health_metadata(fleet: FleetResource) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """fleet/health's metadata (every source's verdict and why, the unhealthy ones, fleet-wide sums)
    and each source's own (`fleet/sources/<source>`: its verdict, one numeric entry per figure, and
    its pacing).

    Every figure is a numeric entry the UI plots over time, each source's on its own asset so that
    none falls past the UI's limit whatever the number of sources; a figure without a value (a rate
    with no requests) is left out rather than plotted as 0. The verdicts are `investigations fleet`'s."""
    store = fleet.store
    circuits = {source: state.state for source, state in Circuits(store).all_states().items()}
    figures = fleet_figures(store, fleet.catalog, circuits=circuits, data_dir=fleet.settings().data_dir)
    return health_metadata(figures, lanes=lane_standings(store, fleet.catalog))


def health_metadata(figures: Sequence[SourceFigures], *, lanes: Sequence[LaneStanding] = ()
                    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """`fleet_health_metadata` from the sources' figures and their rate lanes."""
    per_source: dict[str, dict[str, Any]] = {}
    for f in figures:
        own: dict[str, Any] = {"health": f.health, "why": f.health_reason or "-"}
        for name in NUMERIC_FIGURES:
            value = getattr(f, name)
            if value is not None:
                own[name] = MetadataValue.float(float(value))
        if f.cadence is not None:
            # How often its monitored leads are collected again: fixed, or their median learned interval.
            own["cadence"] = f.cadence.text()
            if f.cadence.interval_s is not None:
                own["cadence_interval_s"] = MetadataValue.float(round(f.cadence.interval_s, 1))
        own.update(pacing_metadata([lane for lane in lanes if lane.source == f.source]))
        per_source[f.source] = own
    rows = ["| source | health | why |", "|---|---|---|"]
    rows += [f"| [{f.source}](/assets/fleet/sources/{f.source}) | {f.health} | {f.health_reason or '-'} |"
             for f in figures]
    unhealthy = sorted(f.source for f in figures if f.health not in HEALTHY_VERDICTS)
    sums = {f"fleet/{name}": MetadataValue.float(float(sum(getattr(f, name) or 0 for f in figures)))
            for name in FLEET_SUMS}
    overview = {"unhealthy": MetadataValue.json(unhealthy), "health": MetadataValue.md("\n".join(rows)), **sums}
    return overview, per_source


def pacing_metadata(lanes: Sequence[LaneStanding]) -> dict[str, Any]:
    """One source's pacing from its lanes: the rate its own lane uses and the ceiling it learned, each
    plotted (left out while unknown: no ceiling before the source throttles, nothing before the
    lane's first request), and a `pacing` table of every lane, its own first (none without a lane)."""
    out: dict[str, Any] = {}
    shared = next((lane for lane in lanes if lane.identity_id is None), None)
    if shared is not None:
        out["rate_in_use_per_s"] = MetadataValue.float(round(shared.in_use_per_s, 3))
        if shared.ceiling_per_s is not None:
            out["ceiling_rate_per_s"] = MetadataValue.float(round(shared.ceiling_per_s, 3))
    if lanes:
        out["pacing"] = MetadataValue.table([TableRecord({
            "identity": lane.identity_id or "-",
            "configured_per_s": lane.configured_per_s,
            "in_use_per_s": round(lane.in_use_per_s, 3),
            "ceiling_per_s": None if lane.ceiling_per_s is None else round(lane.ceiling_per_s, 3),
            "ceiling_age_s": None if lane.ceiling_age_s is None else round(lane.ceiling_age_s),
        }) for lane in lanes], schema=PACING_SCHEMA)
    return out


@asset(key=HEALTH_KEY, group_name=FLEET_GROUP, kinds={"sql"})
def fleet_health(fleet: FleetResource) -> MaterializeResult:
    """Every source's health verdict and why, the unhealthy ones, and fleet-wide sums; each source's
    figures are on its own `fleet/sources/<source>` asset.

    The `fleet_health_every_minute` sensor reports these once a minute without a run;
    materializing the asset (from the UI, say) refreshes them at once."""
    overview, _ = fleet_health_metadata(fleet)
    return MaterializeResult(metadata=overview)


def build_source_health_assets(catalog: SourceCatalog) -> list[AssetsDefinition]:
    """One `fleet/sources/<source>` asset per source: its verdict and every figure, plotted over time."""

    def build(source: str) -> AssetsDefinition:
        @asset(key=source_health_key(source), group_name=FLEET_GROUP, kinds={"sql"},
               check_specs=[AssetCheckSpec(HEALTHY_CHECK, asset=source_health_key(source),
                                           description=f"{source}'s verdict is ok or idle (what `investigations "
                                                       "fleet` says): fails with the reason otherwise.")],
               description=f"{source}'s health verdict, figures and pacing, one plot per figure (reported every "
                           "minute by fleet_health_every_minute; materialize to refresh now).")
        def source_health(fleet: FleetResource) -> MaterializeResult:
            _, per_source = fleet_health_metadata(fleet)
            metadata = per_source.get(source, {"health": "unknown source"})
            check = healthy_check(source, metadata)
            return MaterializeResult(metadata=metadata, check_results=[AssetCheckResult(
                check_name=HEALTHY_CHECK, passed=check.passed, severity=check.severity,
                description=check.description, metadata=check.metadata)])

        return source_health

    return [build(spec.name) for spec in catalog.sources]


fleet_report_job = define_asset_job(
    FLEET_REPORT_JOB,
    selection=AssetSelection.assets(DEAD_LETTERS_KEY),
    description="Refresh the fleet's dead-letter asset.",
)

fleet_health_job = define_asset_job(
    FLEET_HEALTH_JOB,
    selection=AssetSelection.assets(HEALTH_KEY) | AssetSelection.key_prefixes(["fleet", "sources"]),
    description="Refresh fleet/health and every source's fleet/sources/<source>: verdicts and figures.",
)
