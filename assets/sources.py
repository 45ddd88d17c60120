"""One partitioned asset per source, built from its spec: the collection of a lead is a partition."""

import warnings

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Backoff,
    DataVersion,
    Failure,
    Jitter,
    MaterializeResult,
    MetadataValue,
    PreviewWarning,
    RetryPolicy,
    asset,
)

from assets.naming import EMPTY_CHECK_NAME, SOURCE_GROUP, pool_name, source_asset_key
from assets.partitions import leads_partitions
from investigations.collect import CollectionFailed, CollectionResult
from investigations.specs import SourceSpec
from resources.fleet import FleetResource


def retry_policy_for(spec: SourceSpec) -> RetryPolicy:
    """Step retries for crashes; request retries happen inside the fetcher and are not repeated here."""
    return RetryPolicy(
        max_retries=spec.retry.step_retries,
        delay=spec.retry.base_delay_s,
        backoff=Backoff.EXPONENTIAL,
        jitter=Jitter.FULL,
    )


def empty_check_result(spec: SourceSpec, result: CollectionResult) -> AssetCheckResult:
    """Fail (ERROR) when the source answered but gave fewer records than it is expected to.

    A source that starts answering 200 with nothing in it looks healthy on every status code; this
    is the check that keeps such an answer from being trusted.
    """
    passed = result.records >= spec.expected_min_records
    return AssetCheckResult(
        check_name=EMPTY_CHECK_NAME,
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        description=None if passed else (
            f"{spec.name} answered with {result.records} record(s); at least "
            f"{spec.expected_min_records} expected. The source may be silently empty or blocking."
        ),
        metadata={
            "records": result.records,
            "expected_min_records": spec.expected_min_records,
            "sample_record_keys": MetadataValue.json(result.sample_keys),
        },
    )


def _empty_check_spec(spec: SourceSpec, key: AssetKey) -> AssetCheckSpec:
    # Partitioned checks are a preview feature in Dagster 1.13; we take it because a check result
    # per lead is what an investigator needs, and silence the warning only for this call.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreviewWarning)
        return AssetCheckSpec(
            EMPTY_CHECK_NAME,
            asset=key,
            partitions_def=leads_partitions,
            description=f"{spec.name} stored at least {spec.expected_min_records} record(s) for the lead.",
        )


def build_source_asset(spec: SourceSpec) -> AssetsDefinition:
    """The partitioned asset collecting `spec` for one lead per partition."""
    key = source_asset_key(spec.name)

    @asset(
        key=key,
        partitions_def=leads_partitions,
        pool=pool_name(spec.name),
        retry_policy=retry_policy_for(spec),
        group_name=SOURCE_GROUP,
        kinds={"parquet"},
        description=spec.description or f"Records collected from {spec.name}, one partition per lead.",
        tags={"investigations/source": spec.name},
        metadata={
            "adapter": spec.adapter,
            "lead_kinds": MetadataValue.json(list(spec.lead_kinds)),
            "rate_per_s": spec.rate.source_per_s,
            "concurrency": spec.concurrency,
            "expected_min_records": spec.expected_min_records,
        },
        check_specs=[_empty_check_spec(spec, key)],
    )
    def _collect(context: AssetExecutionContext, fleet: FleetResource) -> MaterializeResult:
        try:
            result = fleet.collect(spec.name, context.partition_key, run_id=context.run.run_id)
        except CollectionFailed as failed:
            # Permanent failures (4xx, unparseable, refused) are not worth a step retry.
            raise Failure(
                description=str(failed),
                metadata={
                    "reason_group": failed.reason_group,
                    "last_status": failed.last_status if failed.last_status is not None else -1,
                    "attempts": failed.attempts,
                },
                allow_retries=failed.retryable,
            ) from None
        return MaterializeResult(
            metadata={
                "records": result.records,
                "outcome": result.outcome,
                "changed": result.changed,
                "requests": result.requests,
                "path": MetadataValue.path(result.path),
                "content_hash": result.content_hash,
            },
            check_results=[empty_check_result(spec, result)],
            data_version=DataVersion(result.content_hash),
        )

    return _collect
