"""HtmlAdapter: parsing recorded profile pages with `css`, `css@attr` and `@attr` field specs."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from investigations.adapters import ParseError, build_adapter
from investigations.adapters.html import HtmlAdapter
from investigations.evidence.canonical import canonical_json
from investigations.intake.leads import normalize_lead
from investigations.sources.specs import SourceSpec

PAGE_URL = "http://127.0.0.1:8800/flaky/profile/username/alice"
FIELDS = {"id": "@data-id", "title": "a.title", "link": "a.title@href", "published": "time@datetime", "body": "p.body"}

PAGE = b"""<!doctype html><html><body>
<ul class="posts">
  <li class="post" data-id="p1">
    <a class="title" href="/flaky/posts/p1">  First
       <b>post</b> </a>
    <time datetime="2024-03-01T10:00:00Z">March 1</time>
    <p class="body">Hello,
      world.</p>
  </li>
  <li class="post" data-id="">
    <a class="title" href="https://elsewhere.example/p2">Second</a>
    <p class="body">No date here.</p>
  </li>
</ul>
<li class="other" data-id="x">not a post</li>
</body></html>"""


def make_spec(fields: dict[str, str] | None = None, record_key: str | None = "id", selector: str = "li.post") -> SourceSpec:
    return SourceSpec.model_validate(
        {
            "name": "flaky",
            "adapter": "html",
            "lead_kinds": ["username", "org"],
            "request": {"url": "http://127.0.0.1:8800/flaky/profile/{kind}/{value}"},
            "parse": {"records_selector": selector, "record_key": record_key, "fields": fields or FIELDS},
        }
    )


def parse(body: bytes = PAGE, url: str = PAGE_URL, **spec: Any) -> list:
    return build_adapter(make_spec(**spec)).parse(body, url=url)


def test_build_adapter_picks_the_html_adapter() -> None:
    assert isinstance(build_adapter(make_spec()), HtmlAdapter)


def test_requests_for_quotes_the_value_into_one_path_segment() -> None:
    [request] = build_adapter(make_spec()).requests_for(normalize_lead("org", "../admin"))
    assert request.url == "http://127.0.0.1:8800/flaky/profile/org/..%2Fadmin"


def test_each_node_matching_the_records_selector_is_a_record() -> None:
    assert len(parse()) == 2


def test_text_is_stripped_with_whitespace_collapsed() -> None:
    first = parse()[0]
    assert first.fields["title"] == "First post"
    assert first.fields["body"] == "Hello, world."


def test_css_at_attr_reads_an_attribute_of_the_matched_node() -> None:
    assert parse()[0].fields["published"] == "2024-03-01T10:00:00Z"


def test_at_attr_reads_an_attribute_of_the_record_node_itself() -> None:
    assert parse()[0].fields["id"] == "p1"


def test_a_missing_node_gives_none() -> None:
    assert parse()[1].fields["published"] is None


def test_a_missing_attribute_gives_none() -> None:
    [record, _] = parse(fields={"title": "a.title", "rel": "a.title@rel"}, record_key=None)
    assert record.fields["rel"] is None


def test_relative_links_are_made_absolute_and_become_the_record_url() -> None:
    first, second = parse()
    assert first.fields["link"] == "http://127.0.0.1:8800/flaky/posts/p1"
    assert first.url == "http://127.0.0.1:8800/flaky/posts/p1"
    assert second.url == "https://elsewhere.example/p2"


def test_an_href_is_made_absolute_whatever_the_field_is_called() -> None:
    [record, _] = parse(fields={"target": "a.title@href"}, record_key=None)
    assert record.fields["target"] == "http://127.0.0.1:8800/flaky/posts/p1"


def test_record_url_falls_back_to_the_page_url() -> None:
    [record, _] = parse(fields={"title": "a.title"}, record_key=None)
    assert record.url == PAGE_URL


def test_record_key_comes_from_the_record_key_field() -> None:
    assert parse()[0].key == "p1"


def test_record_key_falls_back_to_a_hash_of_the_fields_when_empty() -> None:
    second = parse()[1]
    assert second.key == hashlib.sha256(canonical_json(second.fields).encode()).hexdigest()[:16]


def test_same_page_gives_the_same_records() -> None:
    assert parse() == parse()


def test_a_page_without_matches_is_no_records() -> None:
    assert parse(b"<html><body><p>nothing</p></body></html>") == []


def test_an_invalid_selector_is_a_parse_error_naming_the_key() -> None:
    with pytest.raises(ParseError, match="records_selector"):
        parse(selector="li[[[")
