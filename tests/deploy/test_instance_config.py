"""deploy/dagster.yaml, the instance of a deployment, against Dagster's own schema and the project's
dagster.yaml; and the instance Dagster's Helm chart writes from deploy/helm/values.yaml."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import dagster_instance_config
from dagster._core.storage.config import pg_config
from dagster_postgres.utils import pg_url_from_config
from sqlalchemy.engine import make_url

from tests.deploy.deployfiles import DEPLOY, ROOT, chart_instance, env_names_in_yaml, load_yaml

# The sections of the project's dagster.yaml a deployment must run with as they are.
SHARED = ("run_queue", "concurrency", "run_retries", "run_monitoring")
STORAGE_ENV = {"DAGSTER_PG_USERNAME": "fleet", "DAGSTER_PG_PASSWORD": "pw-from-the-environment",
               "DAGSTER_PG_HOST": "postgres", "DAGSTER_PG_DB": "dagster", "DAGSTER_PG_PORT": "5433"}


def _instance_dir(tmp_path: Path, config: dict) -> str:
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return str(tmp_path)


def test_the_deployed_instance_passes_dagsters_instance_schema(tmp_path: Path) -> None:
    config, custom_class = dagster_instance_config(_instance_dir(tmp_path, load_yaml(DEPLOY / "dagster.yaml")))
    assert custom_class is None
    assert set(config["storage"]) == {"postgres"}
    assert config["run_queue"]["max_user_code_failure_retries"] == 6  # a key of the queue's own schema


def test_dagsters_schema_refuses_a_wrong_key_so_the_check_above_can_fail(tmp_path: Path) -> None:
    config = load_yaml(DEPLOY / "dagster.yaml")
    config["run_queue"]["dequeue_intervall_seconds"] = 1
    with pytest.raises(DagsterInvalidConfigError):
        dagster_instance_config(_instance_dir(tmp_path, config))


def test_dagsters_storage_credentials_come_only_from_the_variables_the_file_names(monkeypatch) -> None:
    storage = load_yaml(DEPLOY / "dagster.yaml")["storage"]["postgres"]
    assert env_names_in_yaml(storage) == set(STORAGE_ENV)
    for name, value in STORAGE_ENV.items():
        monkeypatch.setenv(name, value)
    resolved = process_config(resolve_to_config_type(pg_config()), storage)
    assert resolved.success, resolved.errors
    url = make_url(pg_url_from_config(resolved.value))
    assert (url.drivername, url.username, url.password, url.host, url.port, url.database) == (
        "postgresql+psycopg2", "fleet", "pw-from-the-environment", "postgres", 5433, "dagster")


def test_without_its_password_variable_dagster_refuses_the_storage_and_names_the_variable(monkeypatch) -> None:
    storage = load_yaml(DEPLOY / "dagster.yaml")["storage"]["postgres"]
    for name, value in STORAGE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DAGSTER_PG_PASSWORD")
    resolved = process_config(resolve_to_config_type(pg_config()), storage)
    assert not resolved.success
    assert any("DAGSTER_PG_PASSWORD" in error.message for error in resolved.errors)


@pytest.mark.parametrize("section", SHARED)
def test_the_deployed_instance_runs_with_the_projects_own_section(section: str) -> None:
    project, deployed = load_yaml(ROOT / "dagster.yaml"), load_yaml(DEPLOY / "dagster.yaml")
    assert section in project, f"dagster.yaml has no {section}: section"
    assert deployed.get(section) == project[section], (
        f"deploy/dagster.yaml's {section}: differs from dagster.yaml's; change both together")


# The project's warm run launcher forks run workers on the daemon's machine: a deployment runs them
# where the code location is (its code server, or a container or pod of their own) instead.
ONE_MACHINE_ONLY = ("run_launcher",)


def test_the_deployed_instance_is_the_projects_plus_its_storage_and_nothing_else() -> None:
    project, deployed = load_yaml(ROOT / "dagster.yaml"), load_yaml(DEPLOY / "dagster.yaml")
    assert {k: v for k, v in deployed.items() if k != "storage"} == {
        k: v for k, v in project.items() if k not in ONE_MACHINE_ONLY}
    assert "run_launcher" not in deployed  # Dagster's default: the code server starts each run worker
    assert "storage" not in project  # the embedded default keeps Dagster's SQLite under DAGSTER_HOME


def test_the_deployed_instance_writes_no_credential_into_the_file() -> None:
    postgres = load_yaml(DEPLOY / "dagster.yaml")["storage"]["postgres"]
    assert "postgres_url" not in postgres  # a URL would carry the password in the file
    for key in ("username", "password", "hostname", "db_name", "port"):
        assert set(postgres["postgres_db"][key]) == {"env"}, key


# -- the chart's instance ---------------------------------------------------------------------------


def _chart() -> dict:
    return chart_instance(load_yaml(DEPLOY / "helm" / "values.yaml"))


def test_the_charts_run_coordinator_is_the_run_queue_of_dagster_yaml() -> None:
    coordinator = _chart()["run_coordinator"]
    cls = getattr(importlib.import_module(coordinator["module"]), coordinator["class"])
    from dagster._core.run_coordinator.queued_run_coordinator import QueuedRunCoordinator

    assert cls is QueuedRunCoordinator  # the class `run_queue:` configures
    assert coordinator["config"] == load_yaml(ROOT / "dagster.yaml")["run_queue"]
    checked = process_config(resolve_to_config_type(cls.config_type()), coordinator["config"])
    assert checked.success, checked.errors


@pytest.mark.parametrize("section", [s for s in load_yaml(ROOT / "dagster.yaml")
                                     if s != "run_queue" and s not in ONE_MACHINE_ONLY])
def test_the_charts_instance_has_each_other_section_of_dagster_yaml(section: str) -> None:
    assert _chart().get(section) == load_yaml(ROOT / "dagster.yaml")[section], (
        f"deploy/helm/values.yaml does not give the chart dagster.yaml's {section}:")


def test_the_charts_instance_with_the_deployed_storage_passes_dagsters_schema(tmp_path: Path) -> None:
    chart = {**_chart(), "storage": load_yaml(DEPLOY / "dagster.yaml")["storage"]}
    config, _ = dagster_instance_config(_instance_dir(tmp_path, chart))
    assert config["concurrency"]["runs"]["max_concurrent_runs"] == 8


def test_the_chart_would_connect_with_the_driver_the_deployed_instance_names() -> None:
    values = load_yaml(DEPLOY / "helm" / "values.yaml")
    scheme = load_yaml(DEPLOY / "dagster.yaml")["storage"]["postgres"]["postgres_db"]["scheme"]
    assert values["postgresql"]["postgresqlScheme"] == scheme == "postgresql+psycopg2"
