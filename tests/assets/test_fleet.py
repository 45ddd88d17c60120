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
