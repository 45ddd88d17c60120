"""deploy/Dockerfile and .dockerignore: what the image holds, who it runs as, and what it runs."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest

from investigations.config import Settings
from tests.deploy.deployfiles import (
    DEPLOY,
    ROOT,
    SECRET_NAME,
    click_params,
    dockerfile_copies,
    dockerfile_stages,
    final_stage,
    image_files,
    in_build_context,
    load_yaml,
)


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_image_runs_as_a_user_of_its_own_not_root() -> None:
    stage = final_stage()
    (user,) = [i.args for i in stage.instructions if i.keyword == "USER"][-1:]
    name = user.split(":")[0]
    assert name not in ("root", "0")
    created = " ".join(run.args for run in stage.of("RUN"))
    uid = re.search(rf"useradd\b[^&]*--uid (\d+)[^&]*\b{name}\b", created)
    assert uid and int(uid[1]) > 0, f"no useradd of {name} with a uid"
    # Nothing after USER may need root: the last instruction that writes is before it.
    after = stage.instructions[[i.keyword for i in stage.instructions].index("USER"):]
    assert not [i for i in after if i.keyword in ("RUN", "COPY", "ADD")]


def test_the_image_sets_dagster_home_and_puts_the_deployed_instance_there() -> None:
    home = final_stage().env()["DAGSTER_HOME"]
    assert home.startswith("/")
    assert ("", None, ["deploy/dagster.yaml"], f"{home}/dagster.yaml") in dockerfile_copies()


def test_the_image_holds_no_secret_in_its_environment_or_build_arguments() -> None:
    for stage in dockerfile_stages():
        assert not [name for name in stage.env() if SECRET_NAME.search(name)]
        for arg in stage.of("ARG"):
            assert not SECRET_NAME.search(arg.args.split("=")[0])


def test_every_file_the_image_copies_exists_and_is_in_the_build_context() -> None:
    for _, source_stage, sources, _ in dockerfile_copies():
        if source_stage:
            continue
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the project"
            assert in_build_context(source), f"COPY {source}: .dockerignore leaves it out of the build context"


@pytest.mark.parametrize("path", [".venv/bin/python", ".git/config", ".investigations/state.db",
                                  ".dagster_home/dagster.yaml", "deploy/fleet.env", "deploy/identities.env",
                                  "tests/conftest.py", "bench/README.md", "investigations/__pycache__/x.pyc"])
def test_dockerignore_keeps_local_state_tests_and_secrets_out_of_the_build_context(path: str) -> None:
    assert not in_build_context(path)


def test_the_image_installs_the_project_with_its_deploy_extra() -> None:
    installs = " ".join(run.args for run in final_stage().of("RUN") if "pip install" in run.args)
    assert re.search(r"investigations_fleet-\*\.whl\)?\[deploy\]", installs), installs
    assert _pyproject()["project"]["name"] == "investigations-fleet"


def test_the_deploy_extra_pins_dagster_k8s_with_the_dagster_family_and_only_there() -> None:
    project = _pyproject()["project"]
    (k8s,) = project["optional-dependencies"]["deploy"]
    pins = dict(re.fullmatch(r"([\w-]+)==([\w.]+)", d).groups() for d in project["dependencies"] if "==" in d)
    assert k8s == f"dagster-k8s=={pins['dagster-postgres']}"  # the 0.x line released with dagster's
    assert not [d for d in project["dependencies"] if d.startswith("dagster-k8s")]


def test_the_image_runs_the_code_server_of_the_projects_location_without_an_entrypoint() -> None:
    stage = final_stage()
    assert not stage.of("ENTRYPOINT")  # so Compose's `command` and the chart's `args` are whole commands
    (cmd,) = stage.of("CMD")
    command, params = click_params(cmd.exec_form())
    assert command == "dagster code-server start"
    assert params["module_name"] == "definitions" and params["location_name"] == "investigations"
    assert str(params["port"]) in [i.args for i in stage.of("EXPOSE")]


def test_the_image_finds_the_project_folder_with_its_sources_and_workspaces() -> None:
    stage = final_stage()
    workdir = stage.of("WORKDIR")[-1].args
    assert stage.env()["INVESTIGATIONS_HOME"] == workdir
    for name in ("workspace.yaml", "sources.yaml", "sources.public.yaml", "deploy/workspace.yaml"):
        assert f"{workdir}/{name}" in image_files(), name
    settings = Settings.from_env({"INVESTIGATIONS_HOME": workdir})
    assert settings.sources_path.as_posix() == f"{workdir}/sources.yaml"


def test_the_image_sets_dagsters_planned_event_switch_for_every_service() -> None:
    from investigations.demo.fleet import DAGSTER_ENV

    env = final_stage().env()
    assert {name: env.get(name) for name in DAGSTER_ENV} == DAGSTER_ENV


def test_the_image_keeps_the_fleets_data_and_dagster_home_in_folders_its_user_owns() -> None:
    stage = final_stage()
    env, user = stage.env(), stage.of("USER")[-1].args
    chowned = set()
    for run in stage.of("RUN"):
        for part in run.args.split("&&"):
            words = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], part))
            if words and words[0] == "chown" and user in words:
                chowned |= set(words[1:])
    assert {env["INVESTIGATIONS_DATA_DIR"], env["DAGSTER_HOME"]} <= chowned


def test_the_deployed_workspace_the_image_carries_is_the_one_in_deploy() -> None:
    assert f"{final_stage().env()['INVESTIGATIONS_HOME']}/deploy/workspace.yaml" in image_files()
    assert load_yaml(DEPLOY / "workspace.yaml")["load_from"][0]["grpc_server"]["location_name"] == "investigations"
