"""`make run`: the whole demo fleet on one machine, stopped as one by Ctrl-C.

Starts the sandbox web, the webhook intake and `dagster dev` (UI, daemon, code server), each in
its own process group so a stop reaches every child, then sends the signed demo case. Without a
Slack token of the user's, a local stand-in for Slack's Web API (`investigations/demo/slack.py`)
receives the alerts and prints each one here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from investigations.config import Settings
from investigations.demo.case import demo_body, demo_webhook_id, send_case
from investigations.demo.slack import SlackStandIn

# A fixed secret only for the embedded demo; a real deployment sets INVESTIGATIONS_WEBHOOK_SECRET.
DEMO_WEBHOOK_SECRET = "whsec_ZGVtby1vbmx5LWludmVzdGlnYXRpb25zLXdlYmhvb2stc2VjcmV0"
STOP_GRACE_S = 10.0

# Without a Slack token of the user's, the alert sensor posts to a local stand-in for Slack's Web
# API, with this token (fake: the stand-in is the only thing that accepts it), on this port (another,
# free one if it is taken: the fleet is told the stand-in's URL either way).
SLACK_TOKEN_ENV = "INVESTIGATIONS_SLACK_TOKEN"
DEMO_SLACK_TOKEN = "xoxb-demo-local"
DEMO_SLACK_CHANNEL = "#investigations"
DEMO_SLACK_PORT = 8900


# Dagster settings that only exist as environment variables. A batch run covers a partition range
# around its leads: one "planned" event for the range instead of one per partition (measured on
# SQLite: about 20 ms of CPU per lead at run creation), and the range's other partitions are not
# marked failed when the batch fails.
DAGSTER_ENV = {"DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1"}
# `dagster dev` is what the card runs; its notice that `dg dev` supersedes it is not the user's to act on.
DEV_QUIET_ENV = {"PYTHONWARNINGS": "ignore:Function `dev_command` is superseded"}


def fleet_env(project_root: Path, base: Mapping[str, str] | None = None, *,
              slack_api_url: str | None = None) -> dict[str, str]:
    """The environment of every fleet process: the caller's `INVESTIGATIONS_*` win, defaults fill in.

    With `slack_api_url` (a local stand-in's) and no Slack token of the caller's, the alert sensor
    is pointed at the stand-in: the demo token, the stand-in as the API (whatever
    `INVESTIGATIONS_SLACK_API_URL` said: the demo token goes nowhere else) and `#investigations`
    unless a channel is set. A caller's token leaves all three Slack settings as they are.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("INVESTIGATIONS_DATA_DIR", str(project_root / ".investigations"))
    env.setdefault("INVESTIGATIONS_SOURCES", str(project_root / "sources.yaml"))
    env.setdefault("INVESTIGATIONS_WEBHOOK_SECRET", DEMO_WEBHOOK_SECRET)
    env.setdefault("DAGSTER_HOME", str(project_root / ".dagster_home"))
    env.update(DAGSTER_ENV)
    settings = Settings.from_env(env)
    env.setdefault("INVESTIGATIONS_SANDBOX_URL", f"http://127.0.0.1:{settings.sandbox_port}")
    if slack_api_url and not uses_real_slack(env):
        env[SLACK_TOKEN_ENV] = DEMO_SLACK_TOKEN
        env["INVESTIGATIONS_SLACK_API_URL"] = slack_api_url
        env["INVESTIGATIONS_SLACK_CHANNEL"] = env.get("INVESTIGATIONS_SLACK_CHANNEL") or DEMO_SLACK_CHANNEL
    return env


def uses_real_slack(env: Mapping[str, str]) -> bool:
    """The user set a Slack token: alerts go to Slack itself and no stand-in is started."""
    return bool(env.get(SLACK_TOKEN_ENV))


def start_slack_stand_in(port: int = DEMO_SLACK_PORT) -> SlackStandIn:
    """The local Slack stand-in on `port` on loopback, or on a free port if `port` is taken."""
    try:
        return SlackStandIn("127.0.0.1", port, token=DEMO_SLACK_TOKEN)
    except OSError:
        return SlackStandIn("127.0.0.1", 0, token=DEMO_SLACK_TOKEN)


def slack_destination(env: Mapping[str, str], stand_in: SlackStandIn | None) -> str:
    """Where the fleet's alerts go, for the console (never the token)."""
    channel = env.get("INVESTIGATIONS_SLACK_CHANNEL") or DEMO_SLACK_CHANNEL
    if stand_in is not None:
        return f"{stand_in.base_url}  (local Slack stand-in, {channel}; each alert is also printed here)"
    if uses_real_slack(env):
        return f"Slack (real token set), {channel}"
    return "nowhere (no Slack token)"


def prepare_dagster_home(project_root: Path, dagster_home: Path) -> Path:
    """DAGSTER_HOME holds the instance's storage; its dagster.yaml always mirrors the project's, and
    so does its workspace.yaml, with the code location's working directory made absolute. Return
    that workspace file.

    `dagster dev` runs in DAGSTER_HOME: started in the project's folder, it warns that the
    project's dagster.yaml will not be used, though its copy in DAGSTER_HOME is."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(project_root / "dagster.yaml", dagster_home / "dagster.yaml")
    workspace = yaml.safe_load((project_root / "workspace.yaml").read_text())
    for location in workspace["load_from"]:
        for target in location.values():
            if isinstance(target, dict) and "working_directory" in target:
                target["working_directory"] = str((project_root / target["working_directory"]).resolve())
    path = dagster_home / "workspace.yaml"
    path.write_text(yaml.safe_dump(workspace, sort_keys=False))
    return path


def start_dagster_dev(env: Mapping[str, str], port: int, dagster_home: Path, workspace: Path,
                      **popen: Any) -> subprocess.Popen[bytes]:
    """`dagster dev` (UI, daemon, code server) on `port`, run in DAGSTER_HOME with the workspace
    `prepare_dagster_home` wrote. At warnings and errors only: the daemon's INFO lines (each sensor
    checked, every few seconds) would bury the banner while the fleet idles; each tick's log is in
    the UI."""
    dagster = str(Path(sys.executable).with_name("dagster"))
    return start([dagster, "dev", "-h", "127.0.0.1", "-p", str(port), "-w", str(workspace), "--log-level", "warning"],
                 {**env, **DEV_QUIET_ENV}, dagster_home, **popen)


def start(cmd: list[str], env: Mapping[str, str], cwd: Path, **popen: Any) -> subprocess.Popen[bytes]:
    # A new session per child: `dagster dev` ignores signals inherited as ignored, and its own
    # children must be stopped with it, so we signal the whole group.
    return subprocess.Popen(cmd, env=dict(env), cwd=cwd, start_new_session=True, stdin=subprocess.DEVNULL, **popen)


def stop_all(processes: list[subprocess.Popen[bytes]], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every group, then SIGKILL what is still alive after `grace_s`."""
    for proc in processes:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in processes:
        _signal_group(proc, signal.SIGKILL)  # the group's children too, even if the leader left
        if proc.poll() is None:
            proc.wait(timeout=5)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_http(url: str, *, timeout_s: float, procs: list[subprocess.Popen[bytes]] = ()) -> None:  # type: ignore[assignment]
    """Poll `url` until it answers 200; fail early if one of `procs` died."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=2.0) as client:
        while time.monotonic() < deadline:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{_command(proc)} exited with {proc.returncode}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


def run_demo_fleet(project_root: Path, *, send_demo: bool = True) -> int:
    slack = None if uses_real_slack(os.environ) else start_slack_stand_in()
    try:
        env = fleet_env(project_root, slack_api_url=slack.api_url if slack else None)
        alerts_to = slack_destination(env, slack)
        print(f"Slack alerts go to {alerts_to}", flush=True)
        return _run_processes(project_root, env, alerts_to, send_demo=send_demo)
    finally:
        if slack is not None:
            slack.close()


def _run_processes(project_root: Path, env: dict[str, str], alerts_to: str, *, send_demo: bool) -> int:
    settings = Settings.from_env(env)
    dagster_home = Path(env["DAGSTER_HOME"])
    workspace = prepare_dagster_home(project_root, dagster_home)
    py = sys.executable
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        procs.append(start([py, "-m", "investigations", "sandbox", "--port", str(settings.sandbox_port)], env, project_root))
        procs.append(start([py, "-m", "investigations", "intake", "--port", str(settings.intake_port)], env, project_root))
        procs.append(start_dagster_dev(env, settings.ui_port, dagster_home, workspace))
        sandbox_url, intake_url = env["INVESTIGATIONS_SANDBOX_URL"], f"http://127.0.0.1:{settings.intake_port}"
        ui_url = f"http://127.0.0.1:{settings.ui_port}"
        wait_http(f"{sandbox_url}/healthz", timeout_s=30, procs=procs)
        wait_http(f"{intake_url}/healthz", timeout_s=30, procs=procs)
        wait_http(f"{ui_url}/server_info", timeout_s=120, procs=procs)
        if send_demo:
            # The first of the listed secrets signs (several are listed during a rotation).
            # The same webhook id at every start: the intake stores the demo case once.
            answer = send_case(intake_url, settings.webhook_secrets[0], demo_body(), webhook_id=demo_webhook_id())
            print(f"demo case sent to the intake: HTTP {answer.status_code} {answer.text[:200]}", flush=True)
        print(
            f"\nThe fleet is up.\n  Dagster UI   {ui_url}  (Runs, Assets > sources)\n"
            f"  intake       {intake_url}/v1/leads  (fleet figures: {intake_url}/metrics, `investigations fleet`)\n"
            f"  sandbox web  {sandbox_url}/_control\n"
            f"  Slack alerts {alerts_to}\n"
            f"  records      {settings.records_dir}\nCtrl-C stops everything.\n",
            flush=True,
        )
        while not stopping:
            for proc in procs:
                if proc.poll() is not None:
                    print(f"{_command(proc)} exited with {proc.returncode}; stopping", flush=True)
                    return 1
            time.sleep(0.5)
        return 0
    finally:
        print("stopping the fleet...", flush=True)
        stop_all(procs)


def _command(proc: subprocess.Popen[bytes]) -> str:
    """A process's command line, for messages."""
    args = proc.args
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
