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


def test_fleet_health_records_a_numeric_entry_per_source_and_figure(sandbox_env) -> None:
    from datetime import UTC, datetime

    from dagster import AssetKey, DagsterInstance

    from assets.fleet import fleet_health
    from investigations.collection.events import FetchEvent, Outcome
    from investigations.fleet.stats import NUMERIC_FIGURES
    from investigations.sources.catalog import load_catalog

    settings = Settings.from_env()
    store = StateStore.from_url(settings.database_url)
    for outcome, status in ((Outcome.OK, 200),) * 3 + ((Outcome.BLOCKED, 403),) * 2:
        store.record_fetch(FetchEvent(source="robust", lead_id="l", identity_id="direct", url="https://x.example/",
                                      method="GET", status=status, outcome=outcome, latency_ms=30.0, bytes=10,
                                      attempt=1, at=datetime.now(UTC)))
    store.put_dead_letter(source="flaky", lead_id="l1", reason_group="transient", last_status=503, attempts=4,
                          last_error="HTTP 503")
    with DagsterInstance.ephemeral() as instance:
        assert materialize([fleet_health], resources={"fleet": FleetResource()}, instance=instance).success
        event = instance.get_latest_materialization_event(AssetKey(["fleet", "health"]))
    metadata = event.asset_materialization.metadata
    for spec in load_catalog(settings.sources_path).sources:
        for name in ("backlog", "requests_per_min", "records_per_min", "dead_letters", "spend_today_usd"):
            assert isinstance(metadata[f"{spec.name}/{name}"].value, float), (spec.name, name)
    assert metadata["robust/requests_per_min"].value == 5 / 15
    assert metadata["robust/block_rate"].value == 2 / 5 and metadata["robust/latency_p95_ms"].value == 30.0
    assert "fragile/latency_p95_ms" not in metadata  # no requests, no latency: not plotted as 0
    assert metadata["flaky/dead_letters"].value == 1.0
    assert metadata["robust/health"].value == "blocked" and metadata["slow/health"].value == "idle"
    assert metadata["unhealthy"].value == ["robust"]
    assert set(NUMERIC_FIGURES) >= {key.split("/", 1)[1] for key in metadata if "/" in key} - {"health"}
