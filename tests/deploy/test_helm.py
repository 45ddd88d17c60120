"""deploy/helm/: the values for Dagster's chart and the intake's own Deployment and Service."""

from __future__ import annotations

import pytest

from investigations.config import Settings
from tests.deploy.deployfiles import (
    DEPLOY,
    SECRET_NAME,
    chart_code_server_command,
    click_params,
    final_stage,
    investigations_args,
    k8s_env_names,
    load_yaml,
    load_yaml_documents,
    project_env_names,
    user_deployment,
    walk,
)

SECRET = "investigations-fleet"  # the Secret every fleet container reads its settings from
DATA_CLAIM = "investigations-data"


def _values() -> dict:
    return load_yaml(DEPLOY / "helm" / "values.yaml")


def _intake() -> tuple[dict, dict]:
    docs = {doc["kind"]: doc for doc in load_yaml_documents(DEPLOY / "helm" / "intake.yaml")}
    assert set(docs) == {"Deployment", "Service"}
    return docs["Deployment"], docs["Service"]


def _intake_container() -> dict:
    (container,) = _intake()[0]["spec"]["template"]["spec"]["containers"]
    return container


def test_runs_launch_as_kubernetes_jobs() -> None:
    assert _values()["runLauncher"]["type"] == "K8sRunLauncher"
    assert "k8sRunLauncher" in _values()["runLauncher"]["config"]


def test_the_code_location_runs_the_images_code_server_command_on_its_port() -> None:
    deployment = user_deployment(_values())
    assert _values()["dagster-user-deployments"]["enabled"] is True
    (cmd,) = final_stage().of("CMD")
    chart_command, chart_params = click_params(chart_code_server_command(deployment))
    image_command, image_params = click_params(cmd.exec_form())
    assert chart_command == image_command == "dagster code-server start"
    assert chart_params == image_params
    assert deployment["port"] == image_params["port"]


def test_the_workspace_the_chart_writes_names_the_projects_location() -> None:
    """The chart names the location after the deployment; it must be the code server's own name (and
    the one the sensors' and schedules' states are kept under)."""
    deployment = user_deployment(_values())
    location = click_params(chart_code_server_command(deployment))[1]["location_name"]
    workspace = load_yaml(DEPLOY / "workspace.yaml")["load_from"][0]["grpc_server"]
    assert deployment["name"] == location == workspace["location_name"]


def test_the_chart_mounts_its_instance_where_the_image_keeps_dagster_home() -> None:
    assert _values()["global"]["dagsterHome"] == final_stage().env()["DAGSTER_HOME"]


def test_the_code_location_and_its_run_pods_read_the_fleets_secret_and_data_volume() -> None:
    deployment = user_deployment(_values())
    assert deployment["envSecrets"] == [{"name": SECRET}]
    data_dir = final_stage().env()["INVESTIGATIONS_DATA_DIR"]
    (mount,) = [m for m in deployment["volumeMounts"] if m["mountPath"] == data_dir]
    (volume,) = [v for v in deployment["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == DATA_CLAIM
    assert deployment.get("includeConfigInLaunchedRuns", {"enabled": True})["enabled"]  # run pods get the same


@pytest.mark.parametrize("where", ["code location", "daemon", "webserver", "intake"])
def test_every_variable_set_is_one_the_project_reads(where: str) -> None:
    values = _values()
    env = {"code location": lambda: user_deployment(values).get("env"),
           "daemon": lambda: values["dagsterDaemon"].get("env"),
           "webserver": lambda: values["dagsterWebserver"].get("env"),
           "intake": lambda: _intake_container()["env"]}[where]()
    unknown = k8s_env_names(env) - project_env_names()
    assert not unknown, f"{where} sets {sorted(unknown)}, which nothing in the project reads"


def test_the_code_location_reads_its_settings_like_the_fleet_does() -> None:
    env = {name: str(value) for name, value in user_deployment(_values())["env"].items()}
    settings = Settings.from_env(env)
    assert settings.data_dir.as_posix() == final_stage().env()["INVESTIGATIONS_DATA_DIR"]
    assert settings.sources_path.as_posix() == env["INVESTIGATIONS_SOURCES"]


def test_no_secret_value_is_written_in_the_values() -> None:
    values = _values()
    for path, value in walk(values):
        is_reference = path and path[-1].endswith("Name")  # a Secret's name, e.g. postgresqlSecretName
        if path and SECRET_NAME.search(path[-1]) and not is_reference and isinstance(value, str | int | float):
            assert value == "" or isinstance(value, bool), f"{'.'.join(path)} is written in values.yaml"
    assert values["generatePostgresqlPasswordSecret"] is False  # else the chart makes one from a value here
    for env in (user_deployment(values).get("env", {}), values["dagsterDaemon"].get("env", {}),
                values["dagsterWebserver"].get("env", {})):
        assert not [name for name in env if SECRET_NAME.search(name)], "secrets go in envSecrets, by name"


def test_dagsters_database_password_comes_from_a_named_secret() -> None:
    values = _values()
    assert values["global"]["postgresqlSecretName"]
    assert values["postgresql"]["postgresqlPassword"] == ""


def test_the_intake_runs_the_fleets_image_with_its_intake_command() -> None:
    deployment = user_deployment(_values())
    image = deployment["image"]
    container = _intake_container()
    assert container["image"] == f"{image['repository']}:{image['tag']}"
    assert "command" not in container  # the image has no entrypoint: args is the whole command
    args = investigations_args(container["args"])
    assert args.func.__name__ == "_intake" and args.host == "0.0.0.0"
    (port,) = container["ports"]
    assert port["containerPort"] == args.port


def test_the_intake_reads_only_its_two_secrets_from_the_fleets_secret_by_reference() -> None:
    env = _intake_container()["env"]
    from_secret = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in env if "valueFrom" in item}
    assert set(from_secret) == {"INVESTIGATIONS_DATABASE_URL", "INVESTIGATIONS_WEBHOOK_SECRET"}
    assert all(ref == {"name": SECRET, "key": name} for name, ref in from_secret.items())
    assert not [item for item in env if SECRET_NAME.search(item["name"]) and "value" in item]


def test_the_intake_reads_the_same_sources_file_and_data_folder_as_the_code_location() -> None:
    intake = {item["name"]: item["value"] for item in _intake_container()["env"] if "value" in item}
    location = user_deployment(_values())["env"]
    for name in ("INVESTIGATIONS_SOURCES", "INVESTIGATIONS_DATA_DIR"):
        assert intake[name] == location[name], name  # the same sources file and data folder


def test_the_intakes_probes_ask_healthz_on_its_port_and_the_service_sends_there() -> None:
    container = _intake_container()
    (port,) = container["ports"]
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz" and get["port"] in (port["name"], port["containerPort"])
    deployment, service = _intake()
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] in (port["name"], port["containerPort"])
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_intake_runs_as_the_images_user_without_privileges() -> None:
    pod = _intake()[0]["spec"]["template"]["spec"]
    container = _intake_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == user_deployment(_values())["podSecurityContext"]["runAsUser"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_intake_reads_the_data_volume_the_runs_write() -> None:
    container, pod = _intake_container(), _intake()[0]["spec"]["template"]["spec"]
    data_dir = final_stage().env()["INVESTIGATIONS_DATA_DIR"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == data_dir]
    assert mount.get("readOnly") is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == DATA_CLAIM

