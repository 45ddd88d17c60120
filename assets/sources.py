"""One partitioned asset per source, built from its spec: the collection of a lead is a partition.

A run collects one lead (interactive work) or a batch of leads (a partition range: recurring crawls
and backfills), up to the source's concurrency at once. Each lead gets its own materialization and
check result, so the UI shows per-lead state whichever way it was collected.
"""

import os
import warnings
from collections.abc import Iterator, Mapping
from datetime import timedelta
from concurrent.futures import ThreadPoolExecutor

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    Backoff,
    BackfillPolicy,
    Failure,
    FreshnessPolicy,
    Jitter,
    MetadataValue,
    PreviewWarning,
    RetryPolicy,
    multi_asset,
)

from assets.naming import EMPTY_CHECK_NAME, SOURCE_GROUP, op_name, pool_name, source_asset_key
from assets.partitions import leads_partitions
from investigations.dispatch import batch_size
from investigations.collect import CollectionFailed, CollectionParked, CollectionResult
from investigations.priority import BACKGROUND_NICENESS, HANDOVER_TAG, is_background
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


def backfill_policy_for(spec: SourceSpec) -> BackfillPolicy:
    """UI backfills run as chunks of the dispatcher's batch size (about 90 s at the permitted rate)."""
    return BackfillPolicy.multi_run(max_partitions_per_run=batch_size(spec))


def empty_check(spec: SourceSpec, lead_id: str, records: int, sample_keys: list[str]) -> AssetCheckEvaluation:
    """Fail (ERROR) when the source answered but gave fewer records than it is expected to.

    A source that starts answering 200 with nothing in it looks healthy on every status code; this
    is the check that keeps such an answer from being trusted.
    """
    passed = records >= spec.expected_min_records
    return AssetCheckEvaluation(
        asset_key=source_asset_key(spec.name),
        check_name=EMPTY_CHECK_NAME,
        passed=passed,
        severity=AssetCheckSeverity.ERROR,
        partition=lead_id,
        description=None if passed else (
            f"{spec.name} answered with {records} record(s); at least {spec.expected_min_records} expected. "
            "The source may be silently empty or blocking."
        ),
        metadata={
            "records": records,
            "expected_min_records": spec.expected_min_records,
            "sample_record_keys": MetadataValue.json(sample_keys),
        },
    )


def materialization(spec: SourceSpec, result: CollectionResult) -> AssetMaterialization:
    return AssetMaterialization(
        asset_key=source_asset_key(spec.name),
        partition=result.lead_id,
        metadata={
            "records": result.records,
            "outcome": result.outcome,
            "changed": result.changed,
            "requests": result.requests,
            "path": MetadataValue.path(result.path),
            "content_hash": result.content_hash,
            # Who the requests went out as: ids only, never a proxy URL or credential.
            "identity_ids": MetadataValue.json(result.identity_ids),
            "lease_ids": MetadataValue.json(result.lease_ids),
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
    """The partitioned asset collecting `spec`, one lead per partition."""
    key = source_asset_key(spec.name)

    # A multi_asset of one spec because it may end without materializing (a parked collection is
    # not a failure) and its check may run alone against what is stored (can_subset).
    @multi_asset(
        name=op_name(spec.name),
        specs=[
            AssetSpec(
                key,
                group_name=SOURCE_GROUP,
                kinds={"parquet"},
                skippable=True,
                partitions_def=leads_partitions,
                freshness_policy=freshness_policy_for(spec),
                description=spec.description or f"Records collected from {spec.name}, one partition per lead.",
                tags={"investigations/source": spec.name},
                metadata={
                    "adapter": spec.adapter,
                    "lead_kinds": MetadataValue.json(list(spec.lead_kinds)),
                    "rate_per_s": spec.rate.source_per_s,
                    "concurrency": spec.concurrency,
                    "expected_min_records": spec.expected_min_records,
                },
            )
        ],
        check_specs=[_empty_check_spec(spec, key)],
        partitions_def=leads_partitions,
        can_subset=True,
        pool=pool_name(spec.name),
        retry_policy=retry_policy_for(spec),
        backfill_policy=backfill_policy_for(spec),
    )
    def _collect(context: AssetExecutionContext, fleet: FleetResource) -> Iterator:
        lead_ids = batch_members(context, fleet)
        if key not in context.selected_asset_keys:
            # The check alone: judge what is stored, without asking the source again.
            for lead_id in lead_ids:
                stored = fleet.store.collection(spec.name, lead_id)
                yield empty_check(spec, lead_id, stored.records if stored else 0, [])
            return
        lower_cpu_priority_if_background(context.run.tags)
        failures: list[CollectionFailed] = []
        with ThreadPoolExecutor(max_workers=min(spec.concurrency, len(lead_ids)),
                                thread_name_prefix=f"collect-{spec.name}") as pool:
            # Reported as they come (in batch order), not at the end: a 90 s batch shows progress in
            # the UI, and a crash midway leaves what was stored materialized.
            background = is_background(context.run.tags)
            outcomes = pool.map(lambda lead: _collect_one(fleet, spec, lead, context.run.run_id, background), lead_ids)
            try:
                for lead_id, outcome in zip(lead_ids, outcomes):
                    if isinstance(outcome, CollectionResult):
                        yield materialization(spec, outcome)
                        yield empty_check(spec, lead_id, outcome.records, outcome.sample_keys)
                    elif isinstance(outcome, CollectionParked):
                        context.log.warning(f"{outcome}; back in the queue")
                    else:
                        context.log.error(str(outcome))
                        failures.append(outcome)
            except BaseException:
                # A terminated run stops after the leads in flight instead of collecting the rest of
                # its batch first; those go back to the queue as stale dispatches.
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        if failures:
            # A permanent failure (4xx, unparseable, refused) is not worth a step retry, and neither
            # is a batch: its failed leads are dead letters already, its good ones are stored.
            raise Failure(
                description=f"{len(failures)} of {len(lead_ids)} collection(s) of {spec.name} failed: {failures[0]}",
                metadata={
                    "failed_leads": MetadataValue.json([f.lead_id for f in failures]),
                    "reason_groups": MetadataValue.json(sorted({f.reason_group for f in failures})),
                    "last_status": failures[0].last_status if failures[0].last_status is not None else -1,
                },
                allow_retries=len(lead_ids) == 1 and failures[0].retryable,
            )

    return _collect


def lower_cpu_priority_if_background(tags: Mapping[str, str]) -> None:
    """Give a background run's worker process a lower CPU priority (idempotent: niceness is set, not added).

    The in-process executor runs the whole run in this one process, so only this run yields.
    """
    if is_background(tags) and hasattr(os, "setpriority"):
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < BACKGROUND_NICENESS:
            os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICENESS)


def batch_members(context: AssetExecutionContext, fleet: FleetResource) -> list[str]:
    """The leads this run collects: those the dispatcher handed it that it still owes (a retried
    step or run skips what an earlier attempt finished), else every partition of the run (a lead or
    a range launched from the UI)."""
    handover = context.run.tags.get(HANDOVER_TAG)
    partitions = list(context.partition_keys)
    if not handover:
        return partitions
    in_range = set(partitions)
    return [lead for lead in fleet.store.handover_leads(handover) if lead in in_range]


def freshness_policy_for(spec: SourceSpec) -> FreshnessPolicy:
    """Warn when a source's newest collection is older than its cadence, fail at twice that."""
    cadence = timedelta(seconds=spec.recrawl_every_s)
    return FreshnessPolicy.time_window(fail_window=2 * cadence, warn_window=cadence)


def _collect_one(
    fleet: FleetResource, spec: SourceSpec, lead_id: str, run_id: str, background: bool
) -> CollectionResult | CollectionParked | CollectionFailed:
    try:
        return fleet.collect(spec.name, lead_id, run_id=run_id, background=background)
    except (CollectionParked, CollectionFailed) as outcome:
        return outcome
