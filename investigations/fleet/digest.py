"""What's new, per case: one digest per case and period naming the findings that changed.

A lead's first records are its baseline, not news: a digest names only records added, removed or
changed after a lead's first collection by a source (`evidence.records.RecordChanges.news`). A case
with no news in the period gets no digest at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

# A digest names at most this many (source, lead) lines, then says how many more changed.
MAX_LINES = 15
# ... and at most this many record keys per line.
MAX_KEYS = 3


def window(now_s: float, period_s: float) -> int:
    """The index of the period `now_s` falls in (periods are aligned to the epoch, UTC)."""
    return int(now_s // period_s)


def is_news(change: Mapping[str, Any]) -> bool:
    """A change log line an investigator is told of: not a lead's first records, and something changed."""
    return not change["first"] and bool(change["added"] or change["removed"] or change["modified"])


def case_digest(case_id: str, changes: Sequence[Mapping[str, Any]], *, leads: Mapping[str, str],
                start: datetime, end: datetime) -> str | None:
    """The digest of `case_id` for the period [start, end): its news, per source and lead (`leads`
    maps a lead id to `kind:value`); None when there is none."""
    news = [c for c in changes if is_news(c) and start <= c["at"] < end]
    if not news:
        return None
    added = sum(len(c["added"]) for c in news)
    removed = sum(len(c["removed"]) for c in news)
    modified = sum(len(c["modified"]) for c in news)
    head = (f":newspaper: *{case_id}*: what's new from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC: "
            f"{added} record(s) added, {removed} removed, {modified} changed")
    lines = []
    for change in news[:MAX_LINES]:
        parts = [f"{sign}{len(change[name])} {name}" + (f" ({', '.join(change[name][:MAX_KEYS])}"
                                                         f"{', ...' if len(change[name]) > MAX_KEYS else ''})")
                 for sign, name in (("+", "added"), ("-", "removed"), ("~", "modified")) if change[name]]
        lines.append(f"• {change['source']} {leads.get(change['lead_id'], change['lead_id'])}: {'; '.join(parts)}")
    if len(news) > MAX_LINES:
        lines.append(f"... and {len(news) - MAX_LINES} more; `investigations changes --case {case_id}` lists them all")
    else:
        lines.append(f"`investigations changes --case {case_id}` lists them")
    return "\n".join([head, *lines])
