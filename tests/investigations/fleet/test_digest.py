"""A case's digest names what changed in its leads in the period, never a lead's first records,
and there is none for a period without news."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from investigations.fleet.digest import MAX_LINES, case_digest, is_news, window

START = datetime(2026, 12, 5, tzinfo=UTC)
END = START + timedelta(days=1)
LEADS = {"domain-1": "domain:example.com"}


def change(at: datetime, *, first: bool = False, added=(), removed=(), modified=(), lead: str = "domain-1") -> dict:
    return {"at": at, "source": "robust", "lead_id": lead, "first": first, "added": list(added),
            "removed": list(removed), "modified": list(modified)}


def test_a_period_with_news_is_one_digest_naming_each_change() -> None:
    text = case_digest("case-1", [change(START + timedelta(hours=2), added=["cert-9"], removed=["mx-1"])],
                       leads=LEADS, start=START, end=END)
    assert text is not None and "*case-1*" in text and "1 record(s) added, 1 removed, 0 changed" in text
    assert "robust domain:example.com: +1 added (cert-9); -1 removed (mx-1)" in text


def test_first_records_and_changes_outside_the_period_are_no_news() -> None:
    changes = [change(START + timedelta(hours=1), first=True, added=["a", "b"]),
               change(START - timedelta(minutes=1), added=["old"]), change(END, added=["next"])]
    assert case_digest("case-1", changes, leads=LEADS, start=START, end=END) is None
    assert not is_news(changes[0]) and is_news(changes[1])


def test_a_long_digest_names_the_first_lines_and_says_how_many_more() -> None:
    changes = [change(START + timedelta(minutes=n), added=[f"k{n}"], lead=f"domain-{n}") for n in range(MAX_LINES + 4)]
    text = case_digest("case-1", changes, leads=LEADS, start=START, end=END)
    assert text is not None and "... and 4 more" in text and text.count("\n• ") == MAX_LINES


def test_periods_are_aligned_to_the_epoch() -> None:
    assert window(START.timestamp(), 86400) == window((END - timedelta(seconds=1)).timestamp(), 86400)
    assert window(END.timestamp(), 86400) == window(START.timestamp(), 86400) + 1
