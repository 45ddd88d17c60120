"""A proxy password given through the environment is used, and never shows up anywhere the fleet writes.

The identities file names it as `${PROXY_PASSWORD}`; a real forward proxy on loopback demands it
(Basic proxy auth), so a collection that succeeds proves it was sent. Then every place the fleet
writes is searched for it: Python logs, the Dagster event log of the materializations (metadata
and the failure's traceback included), run tags, the fetch log, dead letters, the identity registry
and cookie jars in the state store, a collection failure's own traceback and a lease's repr.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path

import pytest
from dagster import build_init_resource_context, materialize
from sqlalchemy import select

from assets.sources import build_source_asset
from investigations.collection.collect import CollectionFailed
from investigations.sandbox.proxy import start_proxies
from investigations.sources.specs import load_sources
from investigations.store import schema as s
from resources.fleet import FleetResource

CANARY = "canary-pr0xy-pw-5d1e8b73"
PROXY_HOST = "127.0.0.4"


@pytest.fixture
def proxy_world(sandbox, one_lead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    sandbox.app_state.reset()
    monkeypatch.setenv("PROXY_PASSWORD", CANARY)
    with start_proxies([PROXY_HOST], credentials=("fleet", CANARY)) as proxies:
        identities = tmp_path / "identities.yaml"
        identities.write_text(f"""
tiers: [datacenter]
identities:
  - id: px_canary
    proxy_url: "http://fleet:${{PROXY_PASSWORD}}@{PROXY_HOST}:{proxies[0].port}"
    range: loopback
    tier: datacenter
""")
        sources = tmp_path / "sources.yaml"
        # One source that works through the proxy, one whose target is down (the proxy answers 502).
        sources.write_text(f"""
defaults:
  lead_kinds: [domain]
  retry: {{attempts: 2, base_delay_s: 0.01, max_delay_s: 0.02, step_retries: 0}}
sources:
  - name: proxied
    adapter: json_api
    request: {{url: "{sandbox.url}/robust/api/lookup?kind={{kind}}&q={{value}}"}}
    parse: {{records_path: results, record_key: id}}
  - name: proxied_down
    adapter: json_api
    request: {{url: "http://127.0.0.1:9/lookup?q={{value}}"}}
    parse: {{records_path: results}}
""")
        monkeypatch.setenv("INVESTIGATIONS_IDENTITIES", str(identities))
        monkeypatch.setenv("INVESTIGATIONS_SOURCES", str(sources))
        store, lead, instance, _ = one_lead
        yield load_sources(sources), store, lead, instance, proxies[0]


def test_the_proxy_password_is_used(proxy_world) -> None:
    catalog, store, lead, instance, proxy = proxy_world
    result = materialize([build_source_asset(catalog.get("proxied"))], partition_key=lead.id, instance=instance,
                         resources={"fleet": FleetResource()}, raise_on_error=False)
    assert result.success
    (mat,) = result.asset_materializations_for_node("sources__proxied")
    assert mat.metadata["identity_ids"].value == ["px_canary"]
    assert (proxy.stats.forwarded, proxy.stats.auth_refused) == (1, 0)
    assert [row["status"] for row in store.fetch_log(source="proxied")] == [200]


def test_the_proxy_password_never_reaches_logs_events_tags_metadata_or_dead_letters(proxy_world, caplog) -> None:
    catalog, store, lead, instance, proxy = proxy_world
    caplog.set_level(logging.DEBUG)
    results = [
        materialize([build_source_asset(catalog.get(name))], partition_key=lead.id, instance=instance,
                    resources={"fleet": FleetResource()}, raise_on_error=False)
        for name in ("proxied", "proxied_down")
    ]
    assert results[0].success and not results[1].success  # both paths ran: records and a dead letter
    assert store.dead_letters(source="proxied_down") and proxy.stats.upstream_failed == 2

    fleet = FleetResource()
    with pytest.raises(CollectionFailed) as failed:
        fleet.collect("proxied_down", lead.id, run_id="direct-call")
    pool = fleet.collector().fetcher.pool
    assert pool is not None
    lease = pool.acquire("proxied", holder="canary", ttl_s=5)
    assert lease is not None
    pool.release(lease)
    fleet.teardown_after_execution(build_init_resource_context())

    with store.engine.begin() as conn:
        registry = [dict(row) for row in conn.execute(select(s.identities)).mappings()]
        jars = [dict(row) for row in conn.execute(select(s.identity_cookies)).mappings()]
    written = {
        "fetch log": json.dumps(store.fetch_log(), default=str),
        "dead letters": json.dumps([vars(letter) for letter in store.dead_letters()], default=str),
        "identity registry": json.dumps(registry, default=str),
        "cookie jars": json.dumps(jars, default=str),
        "collection failure traceback": "".join(traceback.format_exception(failed.value)),
        "lease repr": repr(lease),
        "python logs": caplog.text,
    }
    for result in results:
        written[f"run {result.run_id} events"] = "\n".join(str(entry) for entry in instance.all_logs(result.run_id))
        written[f"run {result.run_id} tags"] = json.dumps(instance.get_run_by_id(result.run_id).tags)
    assert "stack=[" in written[f"run {results[1].run_id} events"]  # the failure's traceback is searched too
    leaks = [where for where, text in written.items() if CANARY in text]
    assert leaks == []
    assert "fleet:***@" in written["identity registry"]  # the registry shows which proxy, redacted
