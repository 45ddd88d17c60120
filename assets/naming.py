"""Every Dagster name derived from a source name, in one place."""

from __future__ import annotations

from dagster import AssetKey

SOURCE_GROUP = "sources"
EMPTY_CHECK_NAME = "not_silently_empty"
# The source-level checks (one result per source, on the schedule of `source_health`), by the
# judgement of `investigations.fleet.degradation.judge_source` each reports.
SOURCE_CHECK_NAMES = {
    "fresh": "fresh_within_cadence",
    "canaries": "canaries_pass",
    "refusals": "not_refusing",
    "volume": "volume_steady",
    "budget": "within_budget",
}


def source_asset_key(source: str) -> AssetKey:
    return AssetKey(["sources", source])


def pool_name(source: str) -> str:
    return f"source_{source}"


def job_name(source: str) -> str:
    return f"collect_{source}"


def op_name(source: str) -> str:
    # Not job_name(): ops and jobs share one namespace in a code location.
    return f"sources__{source}"
