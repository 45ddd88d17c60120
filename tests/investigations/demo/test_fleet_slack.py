"""`investigations up` and Slack: without a token of the user's, the fleet's processes are pointed at
the local stand-in; with one, the user's Slack settings reach them untouched and no stand-in starts."""

from __future__ import annotations

import socket
from pathlib import Path

from investigations.demo.fleet import (
    DEMO_SLACK_TOKEN,
    fleet_env,
    slack_destination,
    start_slack_stand_in,
    uses_real_slack,
)

ROOT = Path(__file__).resolve().parents[3]
STAND_IN = "http://127.0.0.1:8900/api/"


def test_without_a_token_the_fleet_posts_to_the_stand_in() -> None:
    env = fleet_env(ROOT, {"PATH": "/usr/bin"}, slack_api_url=STAND_IN)
    assert env["INVESTIGATIONS_SLACK_TOKEN"] == DEMO_SLACK_TOKEN == "xoxb-demo-local"
    assert env["INVESTIGATIONS_SLACK_API_URL"] == STAND_IN
    assert env["INVESTIGATIONS_SLACK_CHANNEL"] == "#investigations"
    assert env["PATH"] == "/usr/bin" and env["INVESTIGATIONS_SANDBOX_URL"] == "http://127.0.0.1:8800"


def test_without_a_token_a_chosen_channel_stays_and_the_demo_token_goes_only_to_the_stand_in() -> None:
    env = fleet_env(ROOT, {"INVESTIGATIONS_SLACK_TOKEN": "", "INVESTIGATIONS_SLACK_CHANNEL": "#fleet",
                           "INVESTIGATIONS_SLACK_API_URL": "https://slack.example/api/"}, slack_api_url=STAND_IN)
    assert env["INVESTIGATIONS_SLACK_TOKEN"] == DEMO_SLACK_TOKEN
    assert env["INVESTIGATIONS_SLACK_API_URL"] == STAND_IN
    assert env["INVESTIGATIONS_SLACK_CHANNEL"] == "#fleet"


def test_a_real_token_and_api_url_are_left_as_the_user_set_them() -> None:
    user = {"INVESTIGATIONS_SLACK_TOKEN": "xoxb-users-real-token", "INVESTIGATIONS_SLACK_API_URL": "https://slack.com/api/"}
    assert uses_real_slack(user)
    env = fleet_env(ROOT, user, slack_api_url=STAND_IN)
    assert env["INVESTIGATIONS_SLACK_TOKEN"] == "xoxb-users-real-token"
    assert env["INVESTIGATIONS_SLACK_API_URL"] == "https://slack.com/api/"
    assert "INVESTIGATIONS_SLACK_CHANNEL" not in env  # the alert sensor's own default applies
    assert slack_destination(env, None) == "Slack (real token set), #investigations"


def test_without_a_stand_in_no_slack_setting_is_added() -> None:
    env = fleet_env(ROOT, {})
    assert not any(name.startswith("INVESTIGATIONS_SLACK_") for name in env)
    assert not uses_real_slack(env)


def test_the_stand_in_takes_a_free_port_when_its_own_is_taken_and_says_where_it_is() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stand_in = start_slack_stand_in(port)
    try:
        assert stand_in.api_url.startswith("http://127.0.0.1:") and stand_in.api_url.endswith("/api/")
        assert f":{port}/" not in stand_in.api_url
        env = fleet_env(ROOT, {}, slack_api_url=stand_in.api_url)
        shown = slack_destination(env, stand_in)
        assert shown.startswith(stand_in.base_url) and DEMO_SLACK_TOKEN not in shown
    finally:
        stand_in.close()



def test_the_definitions_the_code_server_loads_post_their_alerts_to_the_stand_in(sandbox_env, monkeypatch,
                                                                                  capsys) -> None:
    from dagster import build_resources

    from definitions import build_definitions
    from investigations.config import Settings

    with start_slack_stand_in(0) as stand_in:
        env = fleet_env(ROOT, {}, slack_api_url=stand_in.api_url)
        for name in ("INVESTIGATIONS_SLACK_TOKEN", "INVESTIGATIONS_SLACK_API_URL", "INVESTIGATIONS_SLACK_CHANNEL"):
            monkeypatch.setenv(name, env[name])
        defs = build_definitions(Settings.from_env())
        assert defs.resolve_sensor_def("alert_operators_in_slack") is not None
        with build_resources({"slack": defs.resources["slack"]}) as resources:
            slack = resources.slack
            assert slack.get_client().chat_postMessage(channel=slack.channel, text="*quiet*: a test alert")["ok"]
        assert [(m["channel"], m["text"]) for m in stand_in.received()] == [("#investigations", "*quiet*: a test alert")]
    out = capsys.readouterr().out
    assert "[slack #investigations] *quiet*: a test alert" in out and DEMO_SLACK_TOKEN not in out


def _run_up(monkeypatch) -> dict:
    """`investigations up` up to where it starts the processes: what it hands them, and whether the
    stand-in it started still answers afterwards."""
    from investigations.demo import fleet

    seen: dict = {}
    started = []

    def stand_in(port: int = 0):
        started.append(fleet.SlackStandIn("127.0.0.1", 0, token=DEMO_SLACK_TOKEN))
        return started[-1]

    def processes(project_root, env, alerts_to, *, send_demo):
        seen.update(env=env, alerts_to=alerts_to)
        return 0

    monkeypatch.setattr(fleet, "start_slack_stand_in", stand_in)
    monkeypatch.setattr(fleet, "_run_processes", processes)
    assert fleet.run_demo_fleet(ROOT, send_demo=False) == 0
    seen["stand_ins"] = started
    return seen


def test_up_starts_the_stand_in_says_where_alerts_go_and_stops_it(monkeypatch, capsys) -> None:
    seen = _run_up(monkeypatch)
    (stand_in,) = seen["stand_ins"]
    assert seen["env"]["INVESTIGATIONS_SLACK_API_URL"] == stand_in.api_url
    assert seen["env"]["INVESTIGATIONS_SLACK_TOKEN"] == DEMO_SLACK_TOKEN
    out = capsys.readouterr().out
    assert f"Slack alerts go to {stand_in.base_url}" in out and DEMO_SLACK_TOKEN not in out
    port = int(stand_in.base_url.rstrip("/").rsplit(":", 1)[1])
    with socket.socket() as probe:  # stopped with the fleet: nothing listens on its port any more
        probe.settimeout(1)
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_up_with_a_real_token_starts_no_stand_in(monkeypatch, capsys) -> None:
    monkeypatch.setenv("INVESTIGATIONS_SLACK_TOKEN", "xoxb-users-real-token")
    seen = _run_up(monkeypatch)
    assert seen["stand_ins"] == []
    assert seen["env"]["INVESTIGATIONS_SLACK_TOKEN"] == "xoxb-users-real-token"
    assert "INVESTIGATIONS_SLACK_API_URL" not in seen["env"]
    out = capsys.readouterr().out
    assert "Slack alerts go to Slack (real token set)" in out and "xoxb-users-real-token" not in out
