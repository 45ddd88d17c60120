"""What the canary tests share: the fleet pointed at a fresh data dir, with one lead to collect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance

from investigations.intake.leads import Lead, normalize_lead
from investigations.store import StateStore


@pytest.fixture
def one_lead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[StateStore, Lead, DagsterInstance, Path]]:
    """Point the fleet at a fresh data dir; yield its state store holding one lead (domain
    example.com), the lead, a Dagster instance with the lead's partition, and the data dir. The test
    points the fleet at its own sources."""
    data_dir = tmp_path / "data"
    monkeypatch.setenv("INVESTIGATIONS_DATA_DIR", str(data_dir))
    store = StateStore.from_url(f"sqlite:///{data_dir / 'state.db'}")
    lead = normalize_lead("domain", "example.com")
    store.add_lead(lead, case_id="case-canary")
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("leads", [lead.id])
    yield store, lead, instance, data_dir
    store.close()
