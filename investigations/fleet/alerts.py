"""What the fleet tells its operators, once per incident.

An alert condition is a named fact about a source that is either raised or not: a check failing, a
circuit open, dead letters piling up. `due_alerts` compares this tick's conditions with the last
tick's (kept by the caller, e.g. in a sensor cursor) and returns a message for each condition that
was just raised, and one for each that just cleared: a source that stays broken is announced once,
not every tick. Plain values in, plain values out; the Dagster layer posts them to Slack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote


@dataclass(frozen=True)
class Condition:
    """A raised condition: its stable key (`kind:source[:detail]`), the source, what is wrong in
    words with its figure, and the UI page that shows it."""

    key: str
    source: str
    summary: str
    path: str


@dataclass(frozen=True)
class Alert:
    key: str
    source: str
    text: str
    resolved: bool


def asset_path(source: str, *, view: str = "checks") -> str:
    """The source asset's page in the Dagster UI."""
    return f"/assets/sources/{quote(source)}?view={view}"


def due_alerts(raised: Mapping[str, Condition], before: Mapping[str, str], *, ui_url: str) -> list[Alert]:
    """The alerts this tick owes: one for each condition raised since the last tick (`before`:
    key -> summary of what was raised then), one resolution for each that cleared."""
    alerts = []
    base = ui_url.rstrip("/")
    for key in sorted(set(raised) - set(before)):
        condition = raised[key]
        alerts.append(Alert(key, condition.source,
                            f":rotating_light: *{condition.source}*: {condition.summary} "
                            f"<{base}{condition.path}|open in Dagster>", resolved=False))
    for key in sorted(set(before) - set(raised)):
        source = key.split(":")[1] if key.count(":") else key
        alerts.append(Alert(key, source, f":white_check_mark: *{source}*: resolved: {before[key]}", resolved=True))
    return alerts


def remembered(raised: Mapping[str, Condition], before: Mapping[str, str], failed: set[str]) -> dict[str, str]:
    """What to remember for the next tick: the raised conditions, except those whose alert could not
    be posted (announced again next tick), plus cleared ones whose resolution could not be posted."""
    state = {key: raised[key].summary for key in raised if key in before or key not in failed}
    state |= {key: before[key] for key in before if key not in raised and key in failed}
    return dict(sorted(state.items()))


def new_dead_letters(letters: Sequence[tuple[str, str, datetime]], *, since: datetime | None
                     ) -> dict[str, tuple[int, str]]:
    """Dead letters first seen after `since`, per source: how many, and the newest one's reason."""
    fresh: dict[str, tuple[int, str, datetime]] = {}
    for source, reason, first_seen in letters:
        if since is not None and first_seen <= since:
            continue
        count, newest_reason, newest_at = fresh.get(source, (0, reason, first_seen))
        if first_seen >= newest_at:
            newest_reason, newest_at = reason, first_seen
        fresh[source] = (count + 1, newest_reason, newest_at)
    return {source: (count, reason) for source, (count, reason, _) in sorted(fresh.items())}


@dataclass
class AlertState:
    """What a sensor remembers between ticks: the raised conditions and the dead letters seen."""

    raised: dict[str, str]
    dead_letters_since: datetime | None

    @classmethod
    def read(cls, cursor: str | None) -> AlertState:
        """From a cursor (empty for a first tick or an unreadable one)."""
        try:
            data = json.loads(cursor) if cursor else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        found = data.get("raised")
        raised = found if isinstance(found, dict) else {}
        since = data.get("dead_letters_since")
        try:
            at = datetime.fromisoformat(since) if isinstance(since, str) else None
        except ValueError:
            at = None
        return cls({str(k): str(v) for k, v in raised.items()}, at)

    def write(self) -> str:
        since = self.dead_letters_since.isoformat() if self.dead_letters_since else None
        return json.dumps({"raised": self.raised, "dead_letters_since": since}, sort_keys=True)
