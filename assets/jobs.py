"""One job per source, so runs are launched, filtered and limited per source in the UI and queue."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from assets.naming import job_name, source_asset_key
from investigations.specs import SourceSpec


# define_asset_job's return type is not exported at dagster's top level (1.13).
SourceJob = UnresolvedAssetJobDefinition


def build_source_job(spec: SourceSpec) -> SourceJob:
    return define_asset_job(
        name=job_name(spec.name),
        selection=AssetSelection.assets(source_asset_key(spec.name)),
        description=f"Collect {spec.name} for one lead (a partition) or a batch of leads.",
        tags={"investigations/source": spec.name},
    )
