"""Slack, through dagster-slack's resource: the token comes from the environment (`EnvVar`), so it
is never part of the code location's configuration that the UI shows."""

from __future__ import annotations

from dagster_slack import SlackResource
from slack_sdk.web.client import WebClient

SLACK_API_URL = "https://slack.com/api/"


class FleetSlack(SlackResource):
    """dagster-slack's `SlackResource` with the channel the fleet posts to, and the Web API it
    talks to (Slack's own unless `api_url` says otherwise, e.g. a local stand-in)."""

    channel: str
    api_url: str = SLACK_API_URL

    def get_client(self) -> WebClient:
        return WebClient(self.token, base_url=self.api_url)
