"""The dead-letter asset lists the groups an operator acts on."""

from __future__ import annotations

from dagster import materialize

from assets.fleet import dead_letters
from investigations.config import Settings
from investigations.store import StateStore
from resources.fleet import FleetResource


def test_dead_letter_asset_counts_groups_and_marks_requeued_letters(sandbox_env) -> None:
    store = StateStore.from_url(Settings.from_env().database_url)
    for source, lead, reason in (("flaky", "l1", "transient"), ("flaky", "l2", "transient"), ("fragile", "l3", "throttled")):
        store.put_dead_letter(source=source, lead_id=lead, reason_group=reason, last_status=503, attempts=4,
                              last_error="HTTP 503 (exhausted 4 attempts)")
    store.requeue_dead_letters(lead_id="l3")
    result = materialize([dead_letters], resources={"fleet": FleetResource()})
    (mat,) = result.asset_materializations_for_node("fleet__dead_letters")
    assert mat.metadata["total"].value == 3
    assert mat.metadata["requeued"].value == 1
    assert mat.metadata["by_reason"].value == {"throttled": 1, "transient": 2}
    assert mat.metadata["by_source"].value == {"flaky": 2, "fragile": 1}
    assert "| fragile | l3 | throttled |" in mat.metadata["newest"].value


def test_no_dead_letters_says_so(sandbox_env) -> None:
    result = materialize([dead_letters], resources={"fleet": FleetResource()})
    (mat,) = result.asset_materializations_for_node("fleet__dead_letters")
    assert mat.metadata["total"].value == 0 and mat.metadata["newest"].value == "No dead letters."


def test_each_source_s_figures_are_numeric_entries_of_its_own_asset(sandbox_env) -> None:
    from datetime import UTC, datetime

    from dagster import AssetCheckKey, AssetKey, DagsterInstance

    from assets.fleet import HEALTHY_CHECK, build_source_health_assets, fleet_health, source_health_key
    from investigations.collection.events import FetchEvent, Outcome
    from investigations.sources.catalog import load_catalog

    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    for outcome, status in ((Outcome.OK, 200),) * 3 + ((Outcome.BLOCKED, 403),) * 2:
        store.record_fetch(FetchEvent(source="robust", lead_id="l", identity_id="direct", url="https://x.example/",
                                      method="GET", status=status, outcome=outcome, latency_ms=30.0, bytes=10,
                                      attempt=1, at=datetime.now(UTC)))
    store.put_dead_letter(source="flaky", lead_id="l1", reason_group="transient", last_status=503, attempts=4,
                          last_error="HTTP 503")
    catalog = load_catalog(settings.sources_path)
    with DagsterInstance.ephemeral() as instance:
        assets = [fleet_health, *build_source_health_assets(catalog)]
        assert materialize(assets, resources={"fleet": FleetResource()}, instance=instance).success
        overview = instance.get_latest_materialization_event(AssetKey(["fleet", "health"])).asset_materialization
        own = {spec.name: instance.get_latest_materialization_event(source_health_key(spec.name)).asset_materialization
               for spec in catalog.sources}
        keys = [AssetCheckKey(source_health_key(spec.name), HEALTHY_CHECK) for spec in catalog.sources]
        checks = {key.asset_key.path[-1]: record.event.dagster_event.event_specific_data
                  for key, record in instance.event_log_storage.get_latest_asset_check_execution_by_key(keys).items()}
    assert not checks["robust"].passed and "blocked" in checks["robust"].description  # read back from Dagster
    assert checks["fragile"].passed
    for spec in catalog.sources:
        for name in ("backlog", "requests_per_min", "records_per_min", "dead_letters", "spend_today_usd"):
            assert isinstance(own[spec.name].metadata[name].value, float), (spec.name, name)
    robust = own["robust"].metadata
    assert robust["requests_per_min"].value == 5 / 15 and robust["health"].value == "blocked"
    assert robust["block_rate"].value == 2 / 5 and robust["latency_p95_ms"].value == 30.0
    assert overview.metadata["fleet/requests_per_min"].value == 5 / 15
    assert "robust" in overview.metadata["unhealthy"].value
    # Each source's cadence, read back from its materialization: fixed, or learned (no lead planned yet).
    assert robust["cadence"].value == "fixed 6h" and robust["cadence_interval_s"].value == 6 * 3600
    assert own["changing"].metadata["cadence"].value == "learned -"


def test_each_source_s_asset_plots_its_lane_s_rate_in_use_and_ceiling_and_lists_its_lanes(sandbox_env) -> None:
    import random
    import time

    from dagster import DagsterInstance

    from assets.fleet import PACING_FIGURES, build_source_health_assets, source_health_key
    from investigations.collection.events import Outcome
    from investigations.pacing import GapSampler, RateLanes
    from investigations.pacing.lanes import identity_lane, source_lane
    from investigations.sources.catalog import load_catalog

    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    catalog = load_catalog(settings.sources_path)
    fragile, robust = catalog.get("fragile"), catalog.get("robust")
    cut_s = time.time() - 120
    lanes = RateLanes(store, sampler=GapSampler(random.Random(1)), clock=lambda: cut_s)
    lanes.feedback([source_lane(fragile)], outcome=Outcome.THROTTLED, retry_after_s=None, throttle=fragile.throttle)
    lanes.feedback([identity_lane(fragile, "dc1_a")], outcome=Outcome.OK, retry_after_s=None, throttle=fragile.throttle)
    lanes.feedback([identity_lane(robust, "dc1_a")], outcome=Outcome.OK, retry_after_s=None, throttle=robust.throttle)
    with DagsterInstance.ephemeral() as instance:
        assert materialize(build_source_health_assets(catalog), resources={"fleet": FleetResource()},
                           instance=instance).success
        own = {name: instance.get_latest_materialization_event(source_health_key(name)).asset_materialization.metadata
               for name in ("fragile", "robust", "quiet")}  # read back from Dagster
    rate = fragile.rate.source_per_s
    assert own["fragile"]["rate_in_use_per_s"].value == rate * fragile.throttle.decrease_factor
    assert own["fragile"]["ceiling_rate_per_s"].value == rate  # throttled at the configured rate
    table = own["fragile"]["pacing"]
    assert [column.name for column in table.schema.columns] == [
        "identity", "configured_per_s", "in_use_per_s", "ceiling_per_s", "ceiling_age_s"]
    (shared, identity) = (record.data for record in table.records)
    assert shared["identity"] == "-" and shared["ceiling_per_s"] == rate and 119 <= shared["ceiling_age_s"] <= 125
    assert identity == {"identity": "dc1_a", "configured_per_s": fragile.rate.identity_per_s,
                        "in_use_per_s": fragile.rate.identity_per_s, "ceiling_per_s": None, "ceiling_age_s": None}
    # Robust's own lane never sent: nothing plotted for it, only its identity's lane listed.
    assert not set(PACING_FIGURES) & set(own["robust"])
    assert [record.data["identity"] for record in own["robust"]["pacing"].records] == ["dc1_a"]
    assert "pacing" not in own["quiet"]  # no lane at all


def test_no_asset_carries_more_numeric_entries_than_the_ui_plots(sandbox_env) -> None:
    import random

    from assets.fleet import PACING_FIGURES, UI_PLOTTED_KEYS, health_metadata
    from investigations.collection.events import Outcome
    from investigations.fleet.stats import fleet_figures, lane_standings
    from investigations.pacing import GapSampler, RateLanes
    from investigations.pacing.lanes import identity_lane, source_lane
    from investigations.sources.specs import parse_sources

    # Forty sources: five were enough to push one asset's figures past the UI's limit.
    catalog = parse_sources("sources:\n" + "".join(
        f"  - {{name: s{i}, adapter: json_api, lead_kinds: [domain], request: {{url: 'https://s{i}.example/{{value}}'}}}}\n"
        for i in range(40)))
    store = StateStore.from_url(Settings.from_env().database_url)
    lanes = RateLanes(store, sampler=GapSampler(random.Random(1)))
    for spec in catalog.sources:
        store.put_dead_letter(source=spec.name, lead_id="l1", reason_group="transient", last_status=503, attempts=4,
                              last_error="HTTP 503")
        # Every source throttled, on its own lane and its identities': each plots its pacing too.
        lanes.feedback([source_lane(spec), *(identity_lane(spec, f"id{n}") for n in range(5))],
                       outcome=Outcome.THROTTLED, retry_after_s=None, throttle=spec.throttle)
    overview, per_source = health_metadata(fleet_figures(store, catalog, circuits={}),
                                           lanes=lane_standings(store, catalog))

    def plotted(metadata: dict) -> int:
        return sum(isinstance(getattr(value, "value", value), int | float) and not isinstance(value, bool)
                   for value in metadata.values())

    assert len(per_source) == 40
    assert max(plotted(metadata) for metadata in (overview, *per_source.values())) <= UI_PLOTTED_KEYS
    assert plotted(per_source["s0"]) >= 5  # the figures are there, as numbers
    assert all(isinstance(per_source["s0"][name].value, float) for name in PACING_FIGURES)  # and the pacing
