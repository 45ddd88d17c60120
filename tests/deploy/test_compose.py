"""deploy/docker-compose.yml: the services a deployment needs, each run the way its program reads it."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from dagster._core.remote_origin import GrpcServerCodeLocationOrigin
from dagster._core.workspace.load_target import WorkspaceFileTarget
from sqlalchemy.engine import make_url

from investigations.config import Settings
from tests.deploy.deployfiles import (
    DEPLOY,
    ROOT,
    SECRET_NAME,
    MissingVariable,
    click_params,
    compose,
    env_file,
    env_names_in_yaml,
    environment_of,
    final_stage,
    image_files,
    interpolate,
    interpolate_tree,
    investigations_args,
    load_yaml,
    project_env_names,
    references,
    strings_in,
)

FLEET_SERVICES = ("code-server", "webserver", "daemon", "intake")
# What Compose is given in a test: the example env file with its secrets filled in.
EXAMPLE_ENV = {**env_file(DEPLOY / "fleet.env.example"), "POSTGRES_PASSWORD": "pg-pass",
               "INVESTIGATIONS_WEBHOOK_SECRET": "whsec_ZGVwbG95LXRlc3Qtc2VjcmV0",
               "INVESTIGATIONS_SLACK_TOKEN": "xoxb-deploy-test"}
# The postgres image's own variables, set on its service only.
POSTGRES_IMAGE_ENV = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


def _services() -> dict:
    return compose()["services"]


def _resolved(env: dict[str, str] | None = None) -> dict:
    return interpolate_tree(compose(), EXAMPLE_ENV if env is None else env)["services"]


def _command(name: str) -> list[str]:
    command = _resolved()[name]["command"]
    assert isinstance(command, list), f"{name}: a command in exec form, so no shell reads it"
    return command


def _published(name: str) -> dict[int, str]:
    """Container port -> host address:port Compose publishes it on."""
    published = {}
    for mapping in _resolved()[name].get("ports", []):
        *host, container = mapping.split(":")
        published[int(container)] = ":".join(host)
    return published


def test_the_deployment_has_postgres_and_the_four_fleet_services() -> None:
    assert set(_services()) == {"postgres", *FLEET_SERVICES}


@pytest.mark.parametrize("name", ["postgres", *FLEET_SERVICES])
def test_each_service_restarts_on_its_own_and_has_a_healthcheck(name: str) -> None:
    service = _services()[name]
    assert service.get("restart") in ("unless-stopped", "always", "on-failure")
    assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    assert {"interval", "timeout", "retries"} <= set(service["healthcheck"])


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_each_fleet_service_runs_the_image_the_dockerfile_builds(name: str) -> None:
    service = _services()[name]
    assert service["image"] == _services()["code-server"]["image"]
    context = (DEPLOY / service["build"]["context"]).resolve()
    assert context == ROOT  # where .dockerignore applies
    assert (context / service["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


def test_the_code_server_runs_the_images_own_command() -> None:
    (cmd,) = final_stage().of("CMD")
    assert click_params(_command("code-server")) == click_params(cmd.exec_form())


def test_the_code_server_serves_the_projects_location_on_all_interfaces() -> None:
    command, params = click_params(_command("code-server"))
    assert command == "dagster code-server start"
    assert params["module_name"] == "definitions" and params["location_name"] == "investigations"
    assert params["host"] == "0.0.0.0"


@pytest.mark.parametrize("name", ["webserver", "daemon"])
def test_the_webserver_and_the_daemon_reach_the_code_server_through_the_deployed_workspace(
        name: str, monkeypatch) -> None:
    workspace = click_params(_command(name))[1]["workspace"]
    assert tuple(workspace) == ("deploy/workspace.yaml",)
    env = environment_of(_resolved()[name])
    for variable in env_names_in_yaml(load_yaml(DEPLOY / "workspace.yaml")):
        monkeypatch.setenv(variable, env[variable])
    (origin,) = WorkspaceFileTarget(paths=[str(ROOT / "deploy" / "workspace.yaml")]).create_origins()
    code_server = click_params(_command("code-server"))[1]
    assert isinstance(origin, GrpcServerCodeLocationOrigin)
    assert (origin.host, origin.port, origin.location_name) == (
        "code-server", code_server["port"], code_server["location_name"])


def test_the_webserver_serves_the_ui_on_the_port_it_publishes_on_loopback_only() -> None:
    command, params = click_params(_command("webserver"))
    assert command == "dagster-webserver" and params["host"] == "0.0.0.0"
    published = _published("webserver")
    assert list(published) == [params["port"]]
    assert published[params["port"]].startswith("127.0.0.1:")  # the UI has no login of its own


def test_the_daemon_runs_the_daemons_of_the_instance() -> None:
    command, _ = click_params(_command("daemon"))
    assert command == "dagster-daemon run"
    assert "ports" not in _services()["daemon"]


def test_the_intake_listens_on_the_port_it_publishes() -> None:
    args = investigations_args(_command("intake"))
    assert args.func.__name__ == "_intake" and args.host == "0.0.0.0"
    assert list(_published("intake")) == [args.port]


@pytest.mark.parametrize(("name", "port_of"), [
    ("code-server", lambda: click_params(_command("code-server"))[1]["port"]),
    ("webserver", lambda: click_params(_command("webserver"))[1]["port"]),
    ("intake", lambda: investigations_args(_command("intake")).port),
])
def test_a_services_healthcheck_asks_its_own_port(name: str, port_of) -> None:
    check = " ".join(_resolved()[name]["healthcheck"]["test"][1:])
    ports = {int(p) for p in re.findall(r"(?:-p |127\.0\.0\.1:)(\d+)", check)}
    assert ports == {port_of()}, check


@pytest.mark.parametrize("name", ["webserver", "daemon"])
def test_the_dagster_services_start_once_the_code_server_and_postgres_are_healthy(name: str) -> None:
    depends = _services()[name]["depends_on"]
    assert depends["code-server"]["condition"] == depends["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", ["code-server", "webserver", "daemon"])
def test_the_dagster_services_get_every_variable_the_deployed_instance_and_workspace_read(name: str) -> None:
    needed = env_names_in_yaml(load_yaml(DEPLOY / "dagster.yaml"))
    needed |= env_names_in_yaml(load_yaml(DEPLOY / "workspace.yaml"))
    assert needed <= set(environment_of(_services()[name]))


def test_dagsters_database_is_the_one_the_postgres_service_creates() -> None:
    services = _resolved()
    postgres = environment_of(services["postgres"])
    for name in ("code-server", "webserver", "daemon"):
        env = environment_of(services[name])
        assert env["DAGSTER_PG_HOST"] == "postgres" and env["DAGSTER_PG_DB"] == postgres["POSTGRES_DB"]
        assert (env["DAGSTER_PG_USERNAME"], env["DAGSTER_PG_PASSWORD"]) == (
            postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"])


@pytest.mark.parametrize("name", ["code-server", "intake"])
def test_the_fleets_state_is_the_database_the_init_script_creates(name: str) -> None:
    url = make_url(environment_of(_resolved()[name])["INVESTIGATIONS_DATABASE_URL"])
    postgres = environment_of(_resolved()["postgres"])
    assert (url.host, url.username, url.password) == ("postgres", postgres["POSTGRES_USER"], "pg-pass")
    created = re.findall(r"CREATE DATABASE (\w+)", (DEPLOY / "postgres-init.sql").read_text())
    assert created == [url.database] and url.database != postgres["POSTGRES_DB"]
    init = [v for v in _services()["postgres"]["volumes"] if v.startswith("./postgres-init.sql:")]
    assert init and init[0].split(":")[1].startswith("/docker-entrypoint-initdb.d/")


@pytest.mark.parametrize("name", FLEET_SERVICES)
def test_a_fleet_service_sets_only_variables_the_project_reads(name: str) -> None:
    unknown = set(environment_of(_services()[name])) - project_env_names()
    assert not unknown, f"{name} sets {sorted(unknown)}, which nothing in the project reads"


def test_only_the_postgres_service_gets_the_postgres_images_variables() -> None:
    assert set(environment_of(_services()["postgres"])) == POSTGRES_IMAGE_ENV


@pytest.mark.parametrize("name", ["code-server", "intake"])
def test_the_fleets_services_read_their_state_sources_and_data_where_the_deployment_keeps_them(name: str) -> None:
    """The container's environment (the image's, then the service's) read as the fleet reads it."""
    image = final_stage().env()
    settings = Settings.from_env({**image, **environment_of(_resolved()[name])})
    assert make_url(settings.database_url).host == "postgres"
    assert settings.data_dir.as_posix() == image["INVESTIGATIONS_DATA_DIR"]
    assert settings.sources_path.as_posix() in image_files()  # a sources file the image has


def test_each_secret_reaches_only_the_services_that_use_it() -> None:
    services = _resolved()
    assert Settings.from_env(environment_of(services["intake"])).webhook_secrets == (
        EXAMPLE_ENV["INVESTIGATIONS_WEBHOOK_SECRET"],)
    assert environment_of(services["code-server"])["INVESTIGATIONS_SLACK_TOKEN"] == "xoxb-deploy-test"
    # Each secret goes only where it is used.
    assert "INVESTIGATIONS_WEBHOOK_SECRET" not in environment_of(services["code-server"])
    for name in ("webserver", "daemon", "intake"):
        assert "INVESTIGATIONS_SLACK_TOKEN" not in environment_of(services[name])


@pytest.mark.parametrize("name", ["POSTGRES_PASSWORD", "INVESTIGATIONS_WEBHOOK_SECRET"])
def test_compose_refuses_to_start_without_a_required_secret(name: str) -> None:
    env = {k: v for k, v in EXAMPLE_ENV.items() if k != name}
    with pytest.raises(MissingVariable) as missing:
        _resolved(env)
    assert missing.value.name == name


def test_every_secret_is_a_reference_to_compose_environment_never_a_value() -> None:
    """Each secret-named variable is a `${NAME}` Compose fills in: with every other variable standing
    for itself, it resolves to one of them, to nothing, or to a URL whose password is one of them."""
    names = {ref.name for text in strings_in(compose()) for ref in references(text)}
    checked = 0
    for service_name, service in compose()["services"].items():
        for variable, value in environment_of(service).items():
            if not SECRET_NAME.search(variable):
                continue
            stand_ins = {name: f"__{name}__" for name in names if name != variable}
            try:
                resolved = interpolate(value, stand_ins)
            except MissingVariable as missing:
                assert missing.name == variable, f"{service_name}: {variable}"
                resolved = ""  # required, and nothing else
            secret = make_url(resolved).password if "://" in resolved else resolved
            assert not secret or re.fullmatch(r"__\w+__", secret), (
                f"{service_name}: {variable} is written in the file ({value!r})")
            checked += 1
    assert checked >= 6


def test_every_required_variable_is_listed_in_the_example_env_file_without_its_value() -> None:
    example = env_file(DEPLOY / "fleet.env.example")
    required = {ref.name for text in strings_in(compose()) for ref in references(text) if ref.operator in (":?", "?")}
    assert required and required <= set(example)
    for variable, value in example.items():
        if SECRET_NAME.search(variable):
            assert value == "", f"fleet.env.example gives {variable} a value"


def test_the_data_volume_is_where_the_image_keeps_the_fleets_data_and_the_intake_only_reads_it() -> None:
    data_dir = final_stage().env()["INVESTIGATIONS_DATA_DIR"]
    mounts = {name: [v for v in service.get("volumes", []) if v.split(":")[1] == data_dir]
              for name, service in _services().items()}
    assert [m.split(":")[0] for m in mounts["code-server"]] == ["fleet-data"]  # runs write records here
    assert mounts["code-server"][0].count(":") == 1  # read-write
    assert mounts["intake"] == ["fleet-data:" + data_dir + ":ro"]
    assert "fleet-data" in compose()["volumes"]


def test_run_logs_are_shared_by_the_runs_and_the_webserver_under_dagster_home() -> None:
    storage = final_stage().env()["DAGSTER_HOME"] + "/storage"
    services = _services()
    assert f"compute-logs:{storage}" in services["code-server"]["volumes"]
    assert f"compute-logs:{storage}" in services["webserver"]["volumes"]


def test_the_ui_address_alerts_link_to_is_where_the_webserver_is_published() -> None:
    ui_url = environment_of(_resolved()["code-server"])["INVESTIGATIONS_UI_URL"]
    assert urlsplit(ui_url).port == int(_published("webserver")[3000].split(":")[-1])
