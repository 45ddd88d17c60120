"""The demo fleet's local Slack: answers the Web API calls the alert sensor makes as Slack does, keeps
and prints every message, shows them as JSON and as a page, and never shows the token."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from slack_sdk.errors import SlackApiError

from investigations.demo.slack import SlackStandIn, console_line
from resources.slack import FleetSlack

TOKEN = "xoxb-demo-test-token-value"
ALERT = (":rotating_light: *quiet*: 3 lead(s) failing `not_silently_empty` (empty, short or missing fields), "
         "e.g. abc123 <http://127.0.0.1:3000/assets/sources/quiet?view=checks|open in Dagster>")


@pytest.fixture
def slack() -> Iterator[SlackStandIn]:
    with SlackStandIn(token=TOKEN) as stand_in:
        yield stand_in


def _client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=5.0)


def test_chat_post_message_answers_as_slack_does_and_the_message_is_kept_and_printed(slack, capsys) -> None:
    with _client() as client:
        answer = client.post(f"{slack.api_url}chat.postMessage", headers={"Authorization": f"Bearer {TOKEN}"},
                             json={"channel": "#investigations", "text": ALERT})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    body = answer.json()
    assert body["ok"] is True and body["channel"] == "#investigations" and body["message"]["text"] == ALERT
    assert body["ts"] and body["ts"] == body["message"]["ts"]
    (message,) = slack.received()
    assert message["channel"] == "#investigations" and message["text"] == ALERT and message["ts"] == body["ts"]
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "[slack #investigations] :rotating_light: *quiet*: 3 lead(s) failing `not_silently_empty` (empty, short or "
        "missing fields), e.g. abc123 open in Dagster (http://127.0.0.1:3000/assets/sources/quiet?view=checks)"]


def test_a_form_body_with_the_token_in_it_is_a_message_too(slack, capsys) -> None:
    with _client() as client:
        answer = client.post(f"{slack.api_url}chat.postMessage",
                             data={"token": TOKEN, "channel": "#ops", "text": "line one\nline two"})
    assert answer.json()["ok"] is True
    assert [m["text"] for m in slack.received()] == ["line one\nline two"]
    assert capsys.readouterr().out == "[slack #ops] line one line two\n"  # one line per message


@pytest.mark.parametrize(("headers", "error"), [({}, "not_authed"),
                                                ({"Authorization": "Bearer xoxb-someone-else"}, "invalid_auth")])
def test_a_missing_or_wrong_token_is_refused_as_slack_refuses_it(slack, headers, error) -> None:
    with _client() as client:
        answer = client.post(f"{slack.api_url}chat.postMessage", headers=headers, json={"channel": "#x", "text": "hi"})
    assert answer.json() == {"ok": False, "error": error}
    assert slack.received() == []


def test_slack_sdk_s_web_client_as_the_fleet_builds_it_posts_and_checks_its_token(slack) -> None:
    resource = FleetSlack(token=TOKEN, channel="#investigations", api_url=slack.api_url)
    client = resource.get_client()
    who = client.auth_test()
    assert who["ok"] and who["user_id"] and who["url"] == slack.base_url
    answer = client.chat_postMessage(channel=resource.channel, text=ALERT)
    assert answer["ok"] and answer["channel"] == "#investigations"
    assert [m["text"] for m in slack.received()] == [ALERT]
    slack.failing = True  # as when Slack cannot post: the client raises, the sensor retries next tick
    with pytest.raises(SlackApiError):
        client.chat_postMessage(channel=resource.channel, text="again")
    assert len(slack.received()) == 1


def test_the_messages_are_served_as_json_and_as_a_page(slack) -> None:
    with _client() as client:
        assert client.get(f"{slack.base_url}messages").json() == []
        assert "No alert yet" in client.get(slack.base_url).text
        client.post(f"{slack.api_url}chat.postMessage", headers={"Authorization": f"Bearer {TOKEN}"},
                    json={"channel": "#investigations", "text": "&lt;script&gt; x < y & z"})
        (message,) = client.get(f"{slack.base_url}messages").json()
        page = client.get(slack.base_url)
    assert message["channel"] == "#investigations" and message["text"] == "&lt;script&gt; x < y & z"
    assert set(message) == {"channel", "text", "ts", "received_at"}
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "&lt;script&gt; x &lt; y &amp; z" in page.text and "<script>" not in page.text


def test_the_token_is_never_printed_served_or_logged(slack, capsys) -> None:
    with _client() as client:
        client.post(f"{slack.api_url}chat.postMessage?token={TOKEN}", headers={"Authorization": f"Bearer {TOKEN}"},
                    json={"channel": "#investigations", "text": f"a message that quotes the token {TOKEN}"})
        client.post(f"{slack.api_url}chat.postMessage", data={"token": TOKEN, "channel": "#x", "text": "form"})
        client.post(f"{slack.api_url}chat.postMessage", headers={"Authorization": "Bearer xoxb-wrong-token-value"},
                    json={"channel": "#x", "text": "refused"})
        served = client.get(f"{slack.base_url}messages").text + client.get(slack.base_url).text
    out = capsys.readouterr()
    assert "[slack #investigations] a message that quotes the token ***" in out.out
    assert "refused chat.postMessage: invalid_auth" in out.out
    for shown in (out.out, out.err, served):
        assert TOKEN not in shown and "xoxb-wrong-token-value" not in shown


def test_any_token_is_accepted_when_none_is_configured_and_unknown_methods_are_refused() -> None:
    with SlackStandIn(echo=None) as slack, _client() as client:
        headers = {"Authorization": "Bearer xoxb-anything-goes"}
        assert client.post(f"{slack.api_url}chat.postMessage", headers=headers,
                           json={"channel": "#x", "text": "hi"}).json()["ok"] is True
        assert client.post(f"{slack.api_url}chat.delete", headers=headers, json={}).json()["error"] == "unknown_method"
        assert client.post(f"{slack.api_url}chat.postMessage", headers=headers,
                           json={"channel": "#x"}).json() == {"ok": False, "error": "no_text"}


def test_a_console_line_is_one_line_with_slack_markup_made_readable() -> None:
    assert console_line("#ops", "*a*\n<https://x.test/a|see> &lt;b&gt; <https://y.test>") == \
        "[slack #ops] *a* see (https://x.test/a) <b> https://y.test"
