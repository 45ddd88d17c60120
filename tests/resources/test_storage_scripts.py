"""Dagster's migration scripts are read once per process, and instances opened from a ref still work."""

from __future__ import annotations

from pathlib import Path

import dagster._core.storage.runs.sqlite.sqlite_run_storage as sqlite_runs
from alembic.config import Config
from alembic.script import ScriptDirectory
from dagster import DagsterInstance
from dagster._core.storage.sql import get_alembic_config

from resources.storage_scripts import read_migration_scripts_once


def test_dagster_script_directories_are_built_once_and_others_each_time(tmp_path: Path) -> None:
    read_migration_scripts_once()
    read_migration_scripts_once()  # idempotent: not wrapped twice
    dagster_config = get_alembic_config(sqlite_runs.__file__)
    assert ScriptDirectory.from_config(dagster_config) is ScriptDirectory.from_config(dagster_config)
    (tmp_path / "versions").mkdir()
    other = Config()
    other.set_main_option("script_location", str(tmp_path))
    assert ScriptDirectory.from_config(other) is not ScriptDirectory.from_config(other)


def test_an_instance_opened_from_its_ref_still_reads_and_writes(tmp_path: Path) -> None:
    read_migration_scripts_once()
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        ref = instance.get_ref()
        instance.add_dynamic_partitions("leads", ["a"])
    for _ in range(2):
        with DagsterInstance.from_ref(ref) as again:
            assert again.get_dynamic_partitions("leads") == ["a"]
