"""Settings read from the environment, with the defaults `make run` and the tests rely on.

Every knob an operator may turn lives here, named after its `INVESTIGATIONS_*` variable, so the
configuration reference (docs/configuration.md) and the code cannot drift apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from investigations.intake.webhooks import parse_secrets

DEFAULT_DATA_DIR = ".investigations"
DEFAULT_SOURCES_FILE = "sources.yaml"
DEFAULT_INTAKE_PORT = 8700
DEFAULT_SANDBOX_PORT = 8800
DEFAULT_UI_PORT = 3000
DEFAULT_DIGEST_PERIOD_S = 86400.0
DEFAULT_RECURRING_EVERY_S = 60.0
DEFAULT_RETIRE_AFTER_S = 7 * 86400.0


class ConfigError(ValueError):
    """A setting is missing or impossible; the message names the variable."""


# What marks the project's folder: the Dagster workspace and the sources file beside it.
_PROJECT_MARKERS = ("workspace.yaml", "sources.yaml")


def project_root(env: Mapping[str, str] | None = None, *, cwd: Path | None = None) -> Path:
    """The folder the default paths (`.investigations/`, `sources.yaml`) are relative to, so a
    command finds the same state from any folder: `INVESTIGATIONS_HOME` if set; else the nearest
    folder at or above the current one that holds the project (workspace.yaml and sources.yaml);
    else the project this package was installed from (an editable install); else the current one."""
    env = os.environ if env is None else env
    if env.get("INVESTIGATIONS_HOME"):
        return Path(env["INVESTIGATIONS_HOME"]).resolve()
    here = (cwd or Path.cwd()).resolve()
    installed = Path(__file__).resolve().parents[1]
    for folder in (here, *here.parents, installed):
        if all((folder / marker).is_file() for marker in _PROJECT_MARKERS):
            return folder
    return here


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str
    sources_path: Path
    identities_path: Path | None
    # Every secret a delivery may be signed with (several during a rotation); the first signs.
    webhook_secrets: tuple[str, ...]
    intake_port: int
    sandbox_port: int
    ui_port: int
    # How often each case's Slack digest of what's new goes out (`INVESTIGATIONS_DIGEST_PERIOD`: 6h, 1d).
    digest_period_s: float = DEFAULT_DIGEST_PERIOD_S
    # How often the recurring planner looks for due leads (`INVESTIGATIONS_RECURRING_EVERY`: 1m, 10s):
    # a lead is collected again at most this late after its cadence came round.
    recurring_every_s: float = DEFAULT_RECURRING_EVERY_S
    # How long a lead that no case holds (registered for a backfill, say) stays one of Dagster's
    # partitions after it was last registered or collected (`INVESTIGATIONS_RETIRE_AFTER`: 7d, 12h).
    # A case's leads retire a few minutes after the case closes, whatever this says.
    retire_after_s: float = DEFAULT_RETIRE_AFTER_S
    # Where operators open the Dagster UI (`INVESTIGATIONS_UI_URL`), for the links in Slack alerts and
    # the CLI; the embedded default is the local webserver `investigations up` starts.
    ui_url: str = ""

    def __post_init__(self) -> None:
        if not self.ui_url:
            object.__setattr__(self, "ui_url", f"http://127.0.0.1:{self.ui_port}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read `INVESTIGATIONS_*` variables, filling in the embedded defaults (SQLite, local dirs)."""
        env = os.environ if env is None else env
        root = project_root(env)
        data_dir = Path(env.get("INVESTIGATIONS_DATA_DIR") or root / DEFAULT_DATA_DIR).resolve()
        database_url = env.get("INVESTIGATIONS_DATABASE_URL") or f"sqlite:///{data_dir / 'state.db'}"
        identities = env.get("INVESTIGATIONS_IDENTITIES")
        return cls(
            data_dir=data_dir,
            database_url=database_url,
            sources_path=Path(env.get("INVESTIGATIONS_SOURCES") or root / DEFAULT_SOURCES_FILE).resolve(),
            identities_path=Path(identities).resolve() if identities else None,
            webhook_secrets=tuple(parse_secrets(env.get("INVESTIGATIONS_WEBHOOK_SECRET") or "")),
            intake_port=_port(env, "INVESTIGATIONS_INTAKE_PORT", DEFAULT_INTAKE_PORT),
            sandbox_port=_port(env, "INVESTIGATIONS_SANDBOX_PORT", DEFAULT_SANDBOX_PORT),
            ui_port=_port(env, "INVESTIGATIONS_UI_PORT", DEFAULT_UI_PORT),
            digest_period_s=_duration_s(env, "INVESTIGATIONS_DIGEST_PERIOD", DEFAULT_DIGEST_PERIOD_S),
            recurring_every_s=_duration_s(env, "INVESTIGATIONS_RECURRING_EVERY", DEFAULT_RECURRING_EVERY_S),
            retire_after_s=_duration_s(env, "INVESTIGATIONS_RETIRE_AFTER", DEFAULT_RETIRE_AFTER_S),
            ui_url=(env.get("INVESTIGATIONS_UI_URL") or "").rstrip("/"),
        )

    @classmethod
    def overlaid(cls, overrides: Mapping[str, str | None], env: Mapping[str, str] | None = None) -> Settings:
        """`from_env` with each set value of `overrides` (a resource's config, by variable name) in
        place of its `INVESTIGATIONS_*` variable."""
        merged = dict(os.environ if env is None else env)
        merged.update({name: value for name, value in overrides.items() if value})
        return cls.from_env(merged)

    @property
    def webhook_secret(self) -> str | None:
        """The secret this fleet's own sender (the demo case) signs with: the first one listed."""
        return self.webhook_secrets[0] if self.webhook_secrets else None

    @property
    def records_dir(self) -> Path:
        return self.data_dir / "records"


def _duration_s(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    from investigations.sources.specs import parse_duration_s  # only when set: the specs are a heavier import

    try:
        return parse_duration_s(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{name}={port} is outside 1..65535")
    return port
