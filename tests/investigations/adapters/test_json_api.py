"""JsonApiAdapter: planning requests from the url template and parsing recorded JSON bodies."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from investigations.adapters import ParseError, build_adapter
from investigations.adapters.json_api import JsonApiAdapter
from investigations.evidence.canonical import canonical_json
from investigations.intake.leads import normalize_lead
from investigations.sources.specs import SourceSpec

PAGE_URL = "http://127.0.0.1:8800/robust/api/lookup?kind=domain&q=example.com"


def make_spec(**parse: Any) -> SourceSpec:
    return SourceSpec.model_validate(
        {
            "name": "robust",
            "adapter": "json_api",
            "lead_kinds": ["domain", "org"],
            "request": {
                "url": "http://127.0.0.1:8800/robust/api/lookup?kind={kind}&q={value}&lead={lead_id}",
                "headers": {"Accept": "application/json"},
            },
            "parse": parse,
        }
    )


def parse(body: Any, url: str = PAGE_URL, **config: Any) -> list:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return build_adapter(make_spec(**config)).parse(raw, url=url)


RECORDED = {
    "results": [
        {"id": "r1", "type": "dns", "value": "93.184.216.34", "meta": {"first_seen": "2024-01-02"}, "source_url": "/dns/r1"},
        {"id": "r2", "type": "cert", "value": "CN=example.com", "meta": {}, "source_url": "https://crt.example/r2"},
    ]
}
FIELDS = {"type": "type", "value": "value", "first_seen": "meta.first_seen", "url": "source_url"}


def test_build_adapter_picks_the_json_api_adapter() -> None:
    assert isinstance(build_adapter(make_spec()), JsonApiAdapter)


def test_requests_for_quotes_the_value_and_fills_kind_and_lead_id() -> None:
    lead = normalize_lead("org", "Acme & Co/Labs?x=1")
    [request] = build_adapter(make_spec()).requests_for(lead)
    assert request.method == "GET"
    assert request.url == f"http://127.0.0.1:8800/robust/api/lookup?kind=org&q=Acme%20%26%20Co%2FLabs%3Fx%3D1&lead={lead.id}"
    assert request.headers == {"Accept": "application/json"}


def test_requests_for_plans_nothing_for_a_kind_the_source_does_not_take() -> None:
    assert build_adapter(make_spec()).requests_for(normalize_lead("ip", "8.8.8.8")) == []


def test_fields_are_picked_by_dotted_path_and_a_missing_path_is_none() -> None:
    records = parse(RECORDED, records_path="results", record_key="id", fields={**FIELDS, "id": "id"})
    assert [r.fields["first_seen"] for r in records] == ["2024-01-02", None]
    assert records[0].fields["type"] == "dns"


def test_record_key_comes_from_the_record_key_field() -> None:
    records = parse(RECORDED, records_path="results", record_key="id", fields={**FIELDS, "id": "id"})
    assert [r.key for r in records] == ["r1", "r2"]


def test_record_key_falls_back_to_a_hash_of_the_fields_when_the_key_field_is_empty() -> None:
    body = {"results": [{"id": "", "value": "x"}]}
    [record] = parse(body, records_path="results", record_key="id")
    assert record.key == hashlib.sha256(canonical_json({"id": "", "value": "x"}).encode()).hexdigest()[:16]


def test_relative_record_url_is_made_absolute_against_the_page() -> None:
    records = parse(RECORDED, records_path="results", fields=FIELDS)
    assert [r.url for r in records] == ["http://127.0.0.1:8800/dns/r1", "https://crt.example/r2"]
    assert records[0].fields["url"] == "http://127.0.0.1:8800/dns/r1"


def test_record_url_falls_back_to_the_page_url_without_its_secrets() -> None:
    [record] = parse([{"v": 1}], url="http://127.0.0.1:8800/api?q=x&api_key=s3cret")
    assert record.url == "http://127.0.0.1:8800/api?q=x&api_key=***"


def test_without_fields_the_whole_item_is_the_record() -> None:
    records = parse(RECORDED, records_path="results")
    assert records[0].fields == RECORDED["results"][0]


def test_empty_records_path_reads_a_top_level_list() -> None:
    assert [r.fields for r in parse([{"a": 1}, {"a": 2}])] == [{"a": 1}, {"a": 2}]


def test_dotted_records_path_reaches_a_nested_list() -> None:
    body = {"data": {"hits": [{"a": 1}]}}
    assert [r.fields for r in parse(body, records_path="data.hits")] == [{"a": 1}]


def test_an_empty_list_is_no_records_not_an_error() -> None:
    assert parse({"results": []}, records_path="results") == []


def test_same_body_gives_the_same_records() -> None:
    body = json.dumps(RECORDED).encode()
    assert parse(body, records_path="results", fields=FIELDS) == parse(body, records_path="results", fields=FIELDS)


@pytest.mark.parametrize(
    ("body", "records_path", "message"),
    [
        (b"<html>oops</html>", "results", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "results", "not valid JSON"),
        ({"results": {"a": 1}}, "results", "records_path 'results' holds a dict, not a list"),
        ({"other": []}, "results", "records_path 'results' holds nothing"),
        ({"results": []}, "", "the top level holds a dict"),
    ],
)
def test_a_body_of_the_wrong_shape_is_a_parse_error(body: Any, records_path: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse(body, records_path=records_path)


def test_record_key_may_name_a_path_in_the_item_that_is_not_an_output_field() -> None:
    # sources.yaml keys its JSON sources on `id` without keeping `id` as a field.
    records = parse(RECORDED, records_path="results", record_key="id", fields=FIELDS)
    assert [r.key for r in records] == ["r1", "r2"]
    assert "id" not in records[0].fields
