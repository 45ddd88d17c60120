"""A secret given to a source through the environment never shows up anywhere the fleet writes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from dagster import materialize

from assets.sources import build_source_asset
from investigations.sources.specs import load_sources
from resources.fleet import FleetResource

CANARY = "canary-s3cr3t-7c1f0e9a"


@pytest.fixture
def secret_world(sandbox, one_lead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SOURCE_API_KEY", CANARY)
    sources = tmp_path / "sources.yaml"
    # Sources that work and sources that keep failing, carrying the key in the query (under a name
    # the redactor knows and one it cannot know), in the url's path and in a header.
    sources.write_text(f"""
sources:
  - name: keyed
    adapter: json_api
    lead_kinds: [domain]
    request:
      url: "{sandbox.url}/robust/api/lookup?kind={{kind}}&q={{value}}&api_key=${{SOURCE_API_KEY}}&appid=${{SOURCE_API_KEY}}"
      headers: {{X-Api-Key: "${{SOURCE_API_KEY}}"}}
    parse: {{records_path: results, record_key: id}}
  - name: keyed_path
    adapter: html
    lead_kinds: [domain]
    request:
      url: "{sandbox.url}/slow/profile/{{kind}}/${{SOURCE_API_KEY}}/{{value}}"
    parse: {{records_selector: li.post, record_key: id, fields: {{id: "@data-id", title: a.title, link: "a.title@href"}}}}
  - name: keyed_path_missing
    adapter: json_api
    lead_kinds: [domain]
    request:
      url: "{sandbox.url}/robust/api/${{SOURCE_API_KEY}}/lookup?q={{value}}"
    parse: {{records_path: results}}
    retry: {{attempts: 2, base_delay_s: 0.01, max_delay_s: 0.02, step_retries: 0}}
  - name: keyed_down
    adapter: json_api
    lead_kinds: [domain]
    request:
      url: "http://127.0.0.1:9/lookup?q={{value}}&token=${{SOURCE_API_KEY}}"
      headers: {{Authorization: "Bearer ${{SOURCE_API_KEY}}"}}
    parse: {{records_path: results}}
    retry: {{attempts: 2, base_delay_s: 0.01, max_delay_s: 0.02, step_retries: 0}}
""")
    monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(sources))
    store, lead, instance, data_dir = one_lead
    return load_sources(sources), store, lead, instance, data_dir


def test_a_source_key_never_reaches_logs_events_tags_metadata_or_dead_letters(secret_world, caplog) -> None:
    catalog, store, lead, instance, data_dir = secret_world
    caplog.set_level(logging.DEBUG)
    results = [
        materialize([build_source_asset(catalog.get(name))], partition_key=lead.id, instance=instance,
                    resources={"fleet": FleetResource()}, raise_on_error=False)
        for name in ("keyed", "keyed_down", "keyed_path", "keyed_path_missing")
    ]
    # Every path ran: successes with records and a failure answered (404) and one never answered.
    assert [result.success for result in results] == [True, False, True, False]
    assert store.dead_letters(source="keyed_down") and store.dead_letters(source="keyed_path_missing")
    assert any("HTTP Request: GET" in r.getMessage() and "/slow/profile/" in r.getMessage() for r in caplog.records)

    written = {
        "fetch log": json.dumps(store.fetch_log(), default=str),
        "dead letters": json.dumps([vars(letter) for letter in store.dead_letters()], default=str),
        "collections": json.dumps([store.collection(n, lead.id) for n in ("keyed", "keyed_down", "keyed_path",
                                                                         "keyed_path_missing")], default=str),
        "records": "".join(p.read_bytes().decode("latin-1") for p in (data_dir / "records").rglob("*.parquet")),
        "python logs": caplog.text,
    }
    for result in results:
        written[f"run {result.run_id} events"] = "\n".join(
            str(entry) for entry in instance.all_logs(result.run_id))
        written[f"run {result.run_id} tags"] = json.dumps(instance.get_run_by_id(result.run_id).tags)
    leaks = [where for where, text in written.items() if CANARY in text]
    assert leaks == []
    assert "api_key=***" in written["fetch log"] and "token=***" in written["fetch log"]
    assert "appid=***" in written["fetch log"] and "/slow/profile/domain/***/example.com" in written["fetch log"]
    assert "/robust/api/***/lookup" in written["fetch log"]
