"""Every file in deploy/ (and .dockerignore) is read by what reads it, and none goes unchecked."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.deployfiles import (
    DEPLOY,
    ROOT,
    dockerfile_stages,
    dockerignore_rules,
    env_file,
    load_yaml,
    load_yaml_documents,
)


def _dockerfile(path: Path) -> Any:
    stages = dockerfile_stages(path)
    assert stages and stages[-1].of("CMD"), "an image without a command"
    return stages


def _sql(path: Path) -> Any:
    statements = [s.strip() for s in re.sub(r"--[^\n]*", "", path.read_text()).split(";") if s.strip()]
    assert statements
    return statements


def _grafana(path: Path) -> Any:
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(dashboard, dict)
    return dashboard


# How each file is read; the tests beside this one check what each says.
READERS: dict[str, Callable[[Path], Any]] = {
    "deploy/Dockerfile": _dockerfile,
    "deploy/dagster.yaml": load_yaml,
    "deploy/workspace.yaml": load_yaml,
    "deploy/docker-compose.yml": load_yaml,
    "deploy/fleet.env.example": env_file,
    "deploy/postgres-init.sql": _sql,
    "deploy/grafana-dashboard.json": _grafana,
    "deploy/helm/values.yaml": load_yaml,
    "deploy/helm/intake.yaml": load_yaml_documents,
    ".dockerignore": lambda path: dockerignore_rules(path),
}


def _deploy_files() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for path in DEPLOY.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def test_every_file_in_deploy_has_a_reader_here_and_every_reader_a_file() -> None:
    assert _deploy_files() | {".dockerignore"} == set(READERS)


@pytest.mark.parametrize("relative", sorted(READERS))
def test_each_deploy_file_parses_as_what_it_is(relative: str) -> None:
    parsed = READERS[relative](ROOT / relative)
    assert parsed, f"{relative} is empty"
