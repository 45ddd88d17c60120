"""One job per source, so runs are launched, filtered and limited per source in the UI and queue."""

from __future__ import annotations

from dagster import AssetCheckKey, AssetSelection, define_asset_job

from assets.naming import EMPTY_CHECK_NAME, job_name, source_asset_key
from investigations.sources.specs import SourceSpec
from resources.dagster_internals import UnresolvedAssetJobDefinition

# define_asset_job's return type is not exported at dagster's top level (1.13).
SourceJob = UnresolvedAssetJobDefinition


def build_source_job(spec: SourceSpec) -> SourceJob:
    return define_asset_job(
        name=job_name(spec.name),
        # The asset and its per-lead check, not the source-level checks (`assets.health`): those
        # judge the whole source on their own schedule.
        selection=AssetSelection.assets(source_asset_key(spec.name)).without_checks()
        | AssetSelection.checks(AssetCheckKey(source_asset_key(spec.name), EMPTY_CHECK_NAME)),
        description=f"Collect {spec.name} for one lead (a partition) or a batch of leads.",
        tags={"investigations/source": spec.name},
    )
