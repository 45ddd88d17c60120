"""The loading kit `sources.yaml` and the identities file share: YAML that refuses a key given twice,
defaults merged into entries, `${VAR}` / `${VAR:-default}` expanded from the environment, and
validation errors described with the file, the entry and the key named."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import ValidationError

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def describe_errors(origin: str, exc: ValidationError, entries: list[dict[str, Any]], *, collection: str,
                    label: str, name_key: str) -> str:
    """One line per problem: the file, the entry (by `name_key`, else its position) and the key.
    Never the offending value: it may hold an expanded secret."""
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        where = origin
        if len(loc) >= 2 and loc[0] == collection and isinstance(loc[1], int):
            entry = entries[loc[1]] if loc[1] < len(entries) else {}
            where += f": {label} {entry.get(name_key, f'#{loc[1] + 1}')!r}"
            loc = loc[2:]
        elif loc == [collection]:
            loc = []
        # Pydantic adds the union member's class name into the location; the user never wrote it.
        keys = [str(p) for p in loc if not (isinstance(p, str) and p[:1].isupper())]
        message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: key {'.'.join(keys)!r}: {message}" if keys else f"{where}: {message}")
    return "\n".join(dict.fromkeys(lines))


def merge_defaults(defaults: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    merged = dict(defaults)
    for key, value in entry.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_defaults(merged[key], value)
        else:
            merged[key] = value
    return merged


class EnvMissing(KeyError):
    def __init__(self, key: str, var: str) -> None:
        super().__init__(var)
        self.key = key
        self.var = var

    def __str__(self) -> str:
        return f"environment variable {self.var} is not set and has no default"


def expand_env(value: Any, env: Mapping[str, str], path: tuple[str, ...], secrets: list[str] | None = None) -> Any:
    """Expand `${VAR}` and `${VAR:-default}` in strings; secrets never need to live in the file.

    Every value taken from the environment into a source's request is appended to `secrets` (if given)
    (redacted by value wherever the fleet writes, whatever its place or name), except a base URL
    that starts `request.url`: that is where the source is, not a key. Its password, if it has one,
    is still a secret. A default written in the file is not a secret.
    """
    if isinstance(value, dict):
        return {k: expand_env(v, env, (*path, str(k)), secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, env, path, secrets) for v in value]
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            var, default = match.group(1), match.group(2)
            if var in env and env[var] != "":
                found = env[var]
                if secrets is not None and path[:1] == ("request",):
                    if path == ("request", "url") and match.start() == 0:
                        secrets.append(_url_password(found))
                    else:
                        secrets.append(found)
                return found
            if default is None:
                raise EnvMissing(".".join(path), var)
            return default

        return ENV_REF.sub(sub, value)
    return value


def _url_password(url: str) -> str:
    try:
        return unquote(urlsplit(url).password or "")
    except ValueError:
        return url  # not a URL after all: keep all of it secret


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
