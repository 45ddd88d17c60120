"""Reading the deployment's files (deploy/, .dockerignore) the way the tools that use them do.

Nothing here starts a container: the Dockerfile's instructions, Compose's `${VAR}` interpolation,
.dockerignore's patterns and the Helm chart's mapping of its values onto the Dagster instance are
read by small parsers of their documented rules, and every command is parsed by the program's own
command-line parser (Dagster's click commands, the `investigations` argparse parser).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import shlex
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# What a secret's variable is called: the values behind these names are never written in a file.
SECRET_NAME = re.compile(r"(SECRET|TOKEN|PASSWORD|PASSWD|DATABASE_URL|API_KEY)", re.I)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


# -- Dockerfile ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest of the instruction, continuations joined

    def exec_form(self) -> list[str] | None:
        """The instruction's arguments in JSON (exec) form, or None in shell form."""
        text = self.args.strip()
        if text.startswith("["):
            value = json.loads(text)
            assert isinstance(value, list) and all(isinstance(v, str) for v in value), self
            return value
        return None

    def options(self) -> tuple[dict[str, str], list[str]]:
        """`--flag=value` options (COPY, RUN) and the remaining words."""
        words = shlex.split(self.args)
        flags = {}
        while words and words[0].startswith("--"):
            name, _, value = words.pop(0)[2:].partition("=")
            flags[name] = value
        return flags, words


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """ENV key=value pairs, in order, later ones winning."""
        values: dict[str, str] = {}
        for instruction in self.of("ENV"):
            for word in shlex.split(instruction.args):
                name, sep, value = word.partition("=")
                assert sep, f"ENV {instruction.args!r}: only the key=value form is read here"
                values[name] = _expand(value, values)
            # A value may name an earlier one (${DAGSTER_HOME}); shlex already dropped the quotes.
        return values


def _expand(text: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m[1] or m[2], m[0]), text)


def dockerfile_instructions(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile: comment lines dropped (also inside a continued instruction),
    lines ending in a backslash joined with the next."""
    instructions: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical = pending + stripped
        pending = ""
        keyword, _, args = logical.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


def dockerfile_stages(path: Path = DEPLOY / "Dockerfile") -> list[Stage]:
    stages: list[Stage] = []
    args: dict[str, str] = {}
    for instruction in dockerfile_instructions(path.read_text(encoding="utf-8")):
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=_expand(words[0], args), name=name))
        elif not stages:
            assert instruction.keyword == "ARG", f"{instruction.keyword} before the first FROM"
            name, _, default = instruction.args.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append(instruction)
    return stages


def final_stage() -> Stage:
    return dockerfile_stages()[-1]


def dockerfile_copies() -> list[tuple[str, str | None, list[str], str]]:
    """(stage name, --from, sources, destination) of every COPY of every stage, the destination's
    variables expanded and a relative one made absolute against the WORKDIR in force."""
    found = []
    for stage in dockerfile_stages():
        env, workdir = stage.env(), "/"
        for instruction in stage.instructions:
            if instruction.keyword == "WORKDIR":
                workdir = instruction.args
            if instruction.keyword != "COPY":
                continue
            flags, words = instruction.options()
            *sources, dest = words
            dest = re.sub(r"\$\{(\w+)\}", lambda m, env=env: env[m[1]], dest)
            if not dest.startswith("/"):
                dest = f"{workdir.rstrip('/')}/{dest.removeprefix('./')}"
            found.append((stage.name or "", flags.get("from"), sources, dest))
    return found


def image_files() -> set[str]:
    """The paths the final stage copies project files to."""
    files = set()
    for stage, from_stage, sources, dest in dockerfile_copies():
        if stage or from_stage:
            continue
        for source in sources:
            files.add(f"{dest.rstrip('/')}/{source.split('/')[-1]}" if dest.endswith("/") else dest)
    return files


# -- .dockerignore -----------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go's filepath.Match plus `**`) as a regex over a slash-separated path."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


@cache
def dockerignore_rules(path: Path = ROOT / ".dockerignore") -> tuple[tuple[bool, re.Pattern[str]], ...]:
    rules = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line[1:].strip() if keep else line
        pattern = pattern.strip("/")  # Docker cleans each pattern like a path: no leading or trailing slash
        rules.append((keep, _pattern_regex(pattern)))
    return tuple(rules)


def in_build_context(relative: str) -> bool:
    """Whether the file at `relative` (to the project root) is sent to the builder: the last pattern
    that matches it or one of its parent folders decides, a `!` pattern putting it back."""
    parts = relative.strip("/").split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    included = True
    for keep, regex in dockerignore_rules():
        if any(regex.fullmatch(candidate) for candidate in candidates):
            included = keep
    return included


# -- Compose interpolation -------------------------------------------------------------------------


class MissingVariable(ValueError):
    """A `${VAR:?message}` (or `${VAR?message}`) whose variable is unset (or empty)."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


@dataclass(frozen=True)
class Reference:
    name: str
    operator: str  # "", ":-", "-", ":?", "?", ":+", "+"
    operand: str  # the default, message or replacement, itself interpolated


def _closing_brace(text: str, start: int) -> int:
    depth, i = 1, start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unclosed ${{ in {text!r}")


def _parse_braced(body: str) -> Reference:
    match = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-?+])?", body)
    assert match, f"${{{body}}} names no variable"
    return Reference(match[1], match[2] or "", body[match.end():])


def references(text: str) -> Iterator[Reference]:
    """Every `${...}` and `$NAME` in `text`, nested ones included (`$$` is a literal dollar)."""
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
        elif text.startswith("${", i):
            end = _closing_brace(text, i + 2)
            reference = _parse_braced(text[i + 2:end])
            yield reference
            yield from references(reference.operand)
            i = end + 1
        elif text[i] == "$" and (match := re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i + 1:])):
            yield Reference(match[0], "", "")
            i += 1 + match.end()
        else:
            i += 1


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """`text` as Compose interpolates it from `env` (nested defaults included)."""
    out, i = "", 0
    while i < len(text):
        if text.startswith("$$", i):
            out, i = out + "$", i + 2
        elif text.startswith("${", i):
            end = _closing_brace(text, i + 2)
            ref = _parse_braced(text[i + 2:end])
            out += _resolve(ref, env)
            i = end + 1
        elif text[i] == "$" and (match := re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i + 1:])):
            out += env.get(match[0], "")
            i += 1 + match.end()
        else:
            out, i = out + text[i], i + 1
    return out


def _resolve(ref: Reference, env: Mapping[str, str]) -> str:
    value = env.get(ref.name)
    unset_or_empty = not value
    missing = unset_or_empty if ref.operator.startswith(":") else value is None
    if ref.operator in (":-", "-"):
        return interpolate(ref.operand, env) if missing else str(value)
    if ref.operator in (":?", "?"):
        if missing:
            raise MissingVariable(ref.name, interpolate(ref.operand, env))
        return str(value)
    if ref.operator in (":+", "+"):
        return "" if missing else interpolate(ref.operand, env)
    return value or ""


def interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    """A parsed Compose file with every string value interpolated (keys are not, as in Compose)."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    return node


def strings_in(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from strings_in(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings_in(value)


def compose() -> dict[str, Any]:
    return load_yaml(DEPLOY / "docker-compose.yml")


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's `environment:` as a mapping (Compose takes a mapping or a list of NAME=value)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {name: "" if value is None else str(value) for name, value in env.items()}


def env_file(path: Path) -> dict[str, str]:
    """NAME=value lines of an env file (comments and blank lines skipped)."""
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f"{path.name}: {line!r} is not NAME=value"
            values[name.strip()] = value.strip()
    return values


# -- commands, parsed by their programs' own parsers ----------------------------------------------------


def _click_cli(program: str) -> Any:
    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == program]
    return importlib.import_module(entry.module).cli


def click_params(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """The command a Dagster command line runs (`dagster code-server start`) and its parsed options."""
    import click

    program, *args = argv
    command: click.Command = _click_cli(program)
    ctx = command.make_context(program, list(args))
    path = [program]
    while isinstance(command, click.Group):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # protected_args: Click < 9
            rest = [*ctx.protected_args, *ctx.args]
        name, sub, sub_args = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        path.append(name)
        command, ctx = sub, sub.make_context(name, sub_args, parent=ctx)
    return " ".join(path), dict(ctx.params)


def investigations_args(argv: list[str]) -> Any:
    from investigations.cli import build_parser

    program, *args = argv
    assert program == "investigations", argv
    return build_parser().parse_args(args)


# -- the project's environment variables --------------------------------------------------------------


class _Recording(dict):
    """An environment that remembers every name it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.asked.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.asked.add(key)
        return super().__contains__(key)


def _literal_names(path: Path, pattern: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(pattern, node.value):
            names.add(node.value)
    return names


def env_names_in_yaml(node: Any) -> set[str]:
    """The names a Dagster YAML file (dagster.yaml, workspace.yaml) reads with `{env: NAME}`."""
    if isinstance(node, dict):
        if set(node) == {"env"} and isinstance(node["env"], str):
            return {node["env"]}
        return set().union(*(env_names_in_yaml(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(env_names_in_yaml(v) for v in node)) if node else set()
    return set()


@cache
def project_env_names() -> frozenset[str]:
    """Every environment variable the project reads: the settings (`Settings.from_env`, asked for the
    names it reads), the ones definitions.py and the resources read, the `${VAR}`s of the sources
    files, Dagster's own switch the fleet sets, DAGSTER_HOME, and the names deploy/dagster.yaml and
    deploy/workspace.yaml read."""
    from investigations.config import Settings
    from investigations.demo.fleet import DAGSTER_ENV

    recording = _Recording()
    Settings.from_env(recording)
    names = set(recording.asked)
    for path in [ROOT / "definitions.py", *sorted((ROOT / "resources").glob("*.py"))]:
        names |= _literal_names(path, r"INVESTIGATIONS_[A-Z0-9_]+")
    for sources in ("sources.yaml", "sources.public.yaml"):
        names |= {ref.name for ref in references((ROOT / sources).read_text(encoding="utf-8"))}
    names |= set(DAGSTER_ENV) | {"DAGSTER_HOME"}
    names |= env_names_in_yaml(load_yaml(DEPLOY / "dagster.yaml"))
    names |= env_names_in_yaml(load_yaml(DEPLOY / "workspace.yaml"))
    return frozenset(names)


# -- the Helm chart's values, as the chart writes them into the instance ----------------------------------


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _snake_keys(node: Any) -> Any:
    if isinstance(node, dict):
        return {_snake(key): _snake_keys(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_snake_keys(item) for item in node]
    return node


def chart_instance(values: Mapping[str, Any]) -> dict[str, Any]:
    """The sections of dagster.yaml that Dagster's chart writes from these values (its instance
    ConfigMap): the run coordinator, run monitoring, run retries and sensors from `dagsterDaemon`,
    `concurrency` and `telemetry`. The chart's keys are Dagster's own in camelCase."""
    daemon = values["dagsterDaemon"]
    assert daemon.get("enabled", True), "the chart writes the daemon's sections only with the daemon enabled"
    instance: dict[str, Any] = {}
    coordinator = daemon["runCoordinator"]
    if coordinator["enabled"]:
        if coordinator["type"] == "CustomRunCoordinator":
            custom = coordinator["config"]["customRunCoordinator"]
            instance["run_coordinator"] = {"module": custom["module"], "class": custom["class"],
                                           "config": custom.get("config") or {}}
        else:
            queued = coordinator["config"]["queuedRunCoordinator"]
            instance["run_coordinator"] = {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator",
                                           "config": _snake_keys(queued)}
    for key, section in (("runMonitoring", "run_monitoring"), ("runRetries", "run_retries")):
        if daemon.get(key, {}).get("enabled"):
            instance[section] = _snake_keys(daemon[key])
    if daemon.get("sensors", {}).get("useThreads"):
        instance["sensors"] = _snake_keys(daemon["sensors"])
    concurrency = values.get("concurrency") or {}
    if concurrency.get("enabled"):
        instance["concurrency"] = {section: _snake_keys(concurrency[section])
                                   for section in ("runs", "pools") if concurrency.get(section)}
    if "telemetry" in values:
        instance["telemetry"] = {"enabled": values["telemetry"]["enabled"]}
    return instance


def user_deployment(values: Mapping[str, Any]) -> dict[str, Any]:
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    return deployment


def chart_code_server_command(deployment: Mapping[str, Any]) -> list[str]:
    """What the chart runs in a user deployment's container: `dagster code-server start` on 0.0.0.0
    and the deployment's port, followed by its codeServerArgs."""
    return ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", str(deployment["port"]),
            *deployment["codeServerArgs"]]


def k8s_env_names(env: Any) -> set[str]:
    """The names of a container's `env` (a list of {name, value|valueFrom}) or of a chart's env map."""
    if isinstance(env, dict):
        return set(env)
    return {item["name"] for item in env or []}


def walk(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (path, value) of a parsed YAML tree, keys as path elements."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*path, str(key)))
    elif isinstance(node, list):
        for n, value in enumerate(node):
            yield from walk(value, (*path, str(n)))
