"""The Definitions load, and each source gets its own asset, job, pool and retry policy."""

from __future__ import annotations

from dagster import Backoff, Definitions, Jitter

from assets.naming import job_name, pool_name, source_asset_key
from definitions import build_definitions
from investigations.config import Settings
from investigations.sources.catalog import load_catalog


def test_definitions_load_with_one_asset_job_and_pool_per_source(sandbox_env) -> None:
    settings = Settings.from_env()
    catalog = load_catalog(settings.sources_path)
    defs = build_definitions(settings)
    graph = defs.resolve_asset_graph()
    for spec in catalog.sources:
        node = graph.get(source_asset_key(spec.name))
        assert node.pools == {pool_name(spec.name)}
        assert node.partitions_def is not None and node.partitions_def.name == "leads"
        assert defs.resolve_job_def(job_name(spec.name)) is not None


def test_retry_policy_comes_from_the_source_entry(sandbox_env) -> None:
    settings = Settings.from_env()
    spec = load_catalog(settings.sources_path).get("fragile")
    assets_def = build_definitions(settings).resolve_assets_def(source_asset_key("fragile"))
    policy = assets_def.op.retry_policy
    assert policy.max_retries == spec.retry.step_retries
    assert policy.delay == spec.retry.base_delay_s
    assert policy.backoff == Backoff.EXPONENTIAL and policy.jitter == Jitter.FULL


def test_module_level_defs_load_as_the_code_server_loads_them() -> None:
    import definitions

    # What a code server does on start: every job, asset and sensor resolved, names checked unique.
    Definitions.validate_loadable(definitions.defs)
    assert definitions.defs.resolve_sensor_def("new_leads") is not None


def test_slack_alerts_exist_only_with_a_token_which_stays_an_env_var(sandbox_env, monkeypatch) -> None:
    settings = Settings.from_env()
    monkeypatch.delenv("INVESTIGATIONS_SLACK_TOKEN", raising=False)
    assert "alert_operators_in_slack" not in {s.name for s in build_definitions(settings).sensors}
    monkeypatch.setenv("INVESTIGATIONS_SLACK_TOKEN", "xoxb-secret-value")
    defs = build_definitions(settings)
    Definitions.validate_loadable(defs)
    assert defs.resolve_sensor_def("alert_operators_in_slack") is not None
    slack = defs.resources["slack"]
    # What the UI shows of the resource is the variable's name, never its value.
    assert "xoxb-secret-value" not in repr(slack._get_non_default_public_field_values())
    assert defs.resolve_schedule_def("source_health_every_5_minutes") is not None


def test_fleet_health_is_refreshed_every_minute_by_a_sensor_not_by_a_run(sandbox_env) -> None:
    from dagster import DefaultSensorStatus

    defs = build_definitions(Settings.from_env())
    sensor = defs.resolve_sensor_def("fleet_health_every_minute")
    assert sensor.minimum_interval_seconds == 60 and sensor.default_status == DefaultSensorStatus.RUNNING
    assert not sensor.targets  # it reports fleet/health itself; no run is started
    assert [schedule.name for schedule in defs.schedules] == ["source_health_every_5_minutes"]


def test_the_proxy_resource_is_registered_and_is_the_one_the_fleet_collects_through(sandbox_env) -> None:
    defs = build_definitions(Settings.from_env())
    identities = defs.resources["identities"]
    assert defs.resources["fleet"].identities is identities


def test_the_deployment_workspace_names_the_same_location_at_the_code_server_the_environment_gives(
        monkeypatch) -> None:
    from pathlib import Path

    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("INVESTIGATIONS_CODE_SERVER_HOST", "10.0.0.7")
    monkeypatch.setenv("INVESTIGATIONS_CODE_SERVER_PORT", "4266")
    (deployed,) = WorkspaceFileTarget(paths=[str(root / "deploy" / "workspace.yaml")]).create_origins()
    (local,) = WorkspaceFileTarget(paths=[str(root / "workspace.yaml")]).create_origins()
    assert isinstance(deployed, GrpcServerCodeLocationOrigin)
    assert (deployed.host, deployed.port) == ("10.0.0.7", 4266)
    # Sensor and schedule states are kept per location: both workspaces must name the same one.
    assert deployed.location_name == local.location_name == "investigations"
