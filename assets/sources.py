"""One partitioned asset per source, built from its spec: the collection of a lead is a partition.

A run collects one lead (interactive work) or a batch of leads (a partition range: recurring crawls
and backfills), up to the source's concurrency at once. Each lead gets its own materialization and
check result, so the UI shows per-lead state whichever way it was collected.
"""

import gc
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    Backoff,
    DagsterInstance,
    Failure,
    Jitter,
    MetadataValue,
    Output,
    PreviewWarning,
    RetryPolicy,
    multi_asset,
)

from assets.naming import EMPTY_CHECK_NAME, SOURCE_GROUP, op_name, pool_name, source_asset_key
from assets.partitions import leads_partitions
from investigations.collection.collect import CollectionFailed, CollectionParked, CollectionResult
from investigations.collection.runwork import RunWork
from investigations.fleet.degradation import BASELINE_COLLECTIONS, Verdict, answer_verdict
from investigations.intake.leads import Lead, lead_id_of_partition
from investigations.scheduling.cost import collection_cost_usd, identity_prices, over_budget, spend_today
from investigations.scheduling.dispatch import LeadCadenceView, batch_size, next_visit
from investigations.scheduling.priority import (
    CASE_TAG,
    CHECKS_IN_STEP_TAG,
    HANDOVER_TAG,
    JOINED_CASES_TAG,
    LEADS_TAG,
    PRIORITY_CLASS_TAG,
    PriorityClass,
    is_background,
    lower_cpu_priority_if_background,
)
from investigations.sources.specs import SourceSpec
from investigations.store import QueuedCollection, StateStore
from investigations.store.state import utcnow
from resources.dagster_internals import AssetCheckEvaluationTargetMaterializationData
from resources.fleet import FleetResource

# A batch's check results go to Dagster in groups of this many leads, or once the oldest has waited
# this long: the group's targets are read in one query (per lead, the lookup was 18 % of a SQLite
# batch run worker's main thread).
CHECK_GROUP_LEADS = 25
CHECK_GROUP_S = 2.0


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


def verdict_metadata(verdict: Verdict, sample_keys: list[str] | None = None) -> dict[str, Any]:
    """A verdict as check metadata: the observed value, the threshold, examples and the details."""
    metadata: dict[str, Any] = {"observed": verdict.observed, "threshold": verdict.threshold,
                                "examples": MetadataValue.json(verdict.examples), **verdict.details}
    if sample_keys is not None:
        metadata["sample_record_keys"] = MetadataValue.json(sample_keys)
    return metadata


def severity_of(verdict: Verdict) -> AssetCheckSeverity:
    return AssetCheckSeverity.ERROR if verdict.severity == "error" else AssetCheckSeverity.WARN


def empty_check(
    spec: SourceSpec,
    partition_key: str,
    verdict: Verdict,
    sample_keys: list[str],
    target: AssetCheckEvaluationTargetMaterializationData | None = None,
) -> AssetCheckEvaluation:
    """The lead's answer judged (see `investigations.fleet.degradation.answer_verdict`): ERROR when the
    source gave fewer records than its fixed minimum, WARN when short of its own recent median or
    missing fields its answers always had.

    A source that starts answering 200 with nothing in it looks healthy on every status code; this
    is the check that keeps such an answer from being trusted. `target` is the materialization the
    result judges: Dagster counts a partition's check result as current only when it names the
    partition's latest materialization (otherwise the Partitions tab shows it as missing).
    """
    return AssetCheckEvaluation(
        asset_key=source_asset_key(spec.name),
        check_name=EMPTY_CHECK_NAME,
        passed=verdict.passed,
        severity=severity_of(verdict),
        partition=partition_key,
        target_materialization_data=target,
        description=f"{spec.name} {verdict.description}",
        metadata=verdict_metadata(verdict, sample_keys),
    )


class Baselines:
    """The source's recent answers per lead kind, read once per run and kind (not per lead)."""

    def __init__(self, store: StateStore, spec: SourceSpec) -> None:
        self._store, self._spec = store, spec
        self._by_kind: dict[str, tuple[list[int], list[list[str] | None]]] = {}

    def judge(self, lead_id: str, kind: str, records: int, fields: list[str]) -> Verdict:
        if kind not in self._by_kind:
            recent = self._store.recent_collections(self._spec.name, kind=kind, limit=BASELINE_COLLECTIONS,
                                                    exclude=[lead_id])
            self._by_kind[kind] = ([n for n, _ in recent], [f for _, f in recent])
        counts, field_lists = self._by_kind[kind]
        return answer_verdict(records=records, expected_min=self._spec.expected_min_records, baseline=counts,
                              fields=fields, baseline_fields=field_lists)


def latest_materialization(
    instance: DagsterInstance, key: AssetKey, partition_key: str
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The partition's latest materialization, as a check result names its target (one indexed query).

    This is what Dagster's own `AssetCheckResult` looks up for a single-partition step; a batch run
    covers a partition range, for which Dagster has no per-partition check result, so the asset
    builds each lead's evaluation itself and names its target the same way.
    """
    return latest_materializations(instance, key, [partition_key]).get(partition_key)


def latest_materializations(
    instance: DagsterInstance, key: AssetKey, partition_keys: Sequence[str]
) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """Each partition's latest materialization (leads never materialized left out), in one query for
    a group of leads just stored: the newest records of those partitions, newest first, are theirs.
    A partition the query's limit did not reach (others materialized it since) is looked up alone."""
    wanted = set(partition_keys)
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=sorted(wanted)), limit=2 * len(wanted)
    ).records
    targets: dict[str, AssetCheckEvaluationTargetMaterializationData] = {}
    for record in records:
        if (partition := record.partition_key) in wanted and partition not in targets:
            targets[partition] = AssetCheckEvaluationTargetMaterializationData(
                run_id=record.event_log_entry.run_id, storage_id=record.storage_id, timestamp=record.timestamp
            )
    if len(records) == 2 * len(wanted) and len(wanted) > 1:
        for partition_key in wanted - set(targets):
            if (target := latest_materialization(instance, key, partition_key)) is not None:
                targets[partition_key] = target
    return targets


class PendingChecks:
    """A batch's check results, judged as each lead is stored and handed to Dagster in groups: the
    targets of a group (each lead's materialization, just stored) are read in one query instead of
    one per lead. A group goes out at CHECK_GROUP_LEADS leads, once its oldest waited
    CHECK_GROUP_S, and at the end of the batch."""

    def __init__(self, instance: DagsterInstance, spec: SourceSpec, *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._instance, self._spec, self._clock = instance, spec, clock
        self._pending: list[tuple[str, Verdict, list[str]]] = []
        self._since = 0.0

    def add(self, partition_key: str, verdict: Verdict, sample_keys: list[str]) -> None:
        if not self._pending:
            self._since = self._clock()
        self._pending.append((partition_key, verdict, sample_keys))

    def due(self) -> bool:
        return bool(self._pending) and (len(self._pending) >= CHECK_GROUP_LEADS
                                        or self._clock() - self._since >= CHECK_GROUP_S)

    def take(self) -> list[AssetCheckEvaluation]:
        """The pending results, each naming its lead's latest materialization; none pending after."""
        pending, self._pending = self._pending, []
        if not pending:
            return []
        targets = latest_materializations(self._instance, source_asset_key(self._spec.name),
                                          [partition_key for partition_key, _, _ in pending])
        return [empty_check(self._spec, partition_key, verdict, sample_keys, targets.get(partition_key))
                for partition_key, verdict, sample_keys in pending]


def cadence_metadata(cadence: LeadCadenceView) -> dict[str, Any]:
    """A lead's recurring cadence as materialization metadata (`dispatch.next_visit`): how fast its
    answer changes, as its visits say so far (what a learned cadence is planned on); when its source
    looks at it next (none for a lead not collected again); and why, in a line.

    `next_due` is the source's plan as of its last planning tick (the recurring sensor's, every
    minute) with the lead's own rate now: the planner's next pass may move it a little as the
    budget's split moves; `investigations leads list --cadence` plans every lead now."""
    metadata: dict[str, Any] = {"changes_per_day": round(cadence.changes_per_day, 4), "cadence": cadence.why}
    if cadence.next_due is not None:
        metadata["next_due"] = MetadataValue.timestamp(cadence.next_due)
    return metadata


def materialization(spec: SourceSpec, result: CollectionResult, *, cost_usd: float | None = None,
                    over_budget: bool = False, cadence: LeadCadenceView | None = None) -> AssetMaterialization:
    extra: dict[str, Any] = {} if cadence is None else cadence_metadata(cadence)
    if cost_usd is not None:
        extra["cost_usd"] = round(cost_usd, 6)
    if over_budget:
        # Interactive work still runs past the budget; this says it did.
        extra["over_budget"] = True
    return AssetMaterialization(
        asset_key=source_asset_key(spec.name),
        partition=result.partition_key or result.lead_id,
        metadata={
            # Dagster's own name for it: the catalog and the asset page show it as the row count.
            "dagster/row_count": result.records,
            "records": result.records,
            "outcome": result.outcome,
            # The lead by its parts (an older lead's partition key is its id, a hash).
            "lead_kind": result.lead_kind,
            "lead_value": result.lead_value,
            "changed": result.changed,
            # What changed in the lead's records, by record key (a first collection is a baseline: its
            # records are `first_seen`, not `added`), so the asset's plots show findings coming and going.
            "added": 0 if result.changes.first else len(result.changes.added),
            "removed": len(result.changes.removed),
            "modified": len(result.changes.modified),
            "first_seen": len(result.changes.added) if result.changes.first else 0,
            "requests": result.requests,
            "path": MetadataValue.path(result.path),
            "content_hash": result.content_hash,
            # Who the requests went out as: ids only, never a proxy URL or credential.
            "identity_ids": MetadataValue.json(result.identity_ids),
            "lease_ids": MetadataValue.json(result.lease_ids),
            **extra,
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
    check_key = AssetCheckKey(key, EMPTY_CHECK_NAME)

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
        members = batch_members(context, fleet)
        lead_ids = [member.lead_id for member in members]
        check_selected = check_key in context.selected_asset_check_keys
        # A dispatched batch runs without its check selected (CHECKS_IN_STEP_TAG) and judges its leads all the same.
        judged = check_selected or context.run.tags.get(CHECKS_IN_STEP_TAG) == "true"
        if check_selected:
            # The check's output, once per step: Dagster expects it of every step the check is
            # selected in; the evaluations below carry the results, one per lead.
            yield Output(None, output_name=context.assets_def.get_output_name_for_asset_check_key(check_key))
        if key not in context.selected_asset_keys:
            # The check alone: judge what is stored, without asking the source again.
            baselines = Baselines(fleet.store, spec)
            for lead_id in lead_ids:
                stored = fleet.store.collection(spec.name, lead_id)
                lead, partition = fleet.store.get_lead_keyed(lead_id) or (None, lead_id)
                fields = json.loads(stored.common_fields) if stored and stored.common_fields else []
                verdict = baselines.judge(lead_id, lead.kind if lead else "", stored.records if stored else 0, fields)
                yield empty_check(spec, partition, verdict, [], latest_materialization(context.instance, key, partition))
            return
        background = is_background(context.run.tags)
        open_to_joins = context.run.tags.get(PRIORITY_CLASS_TAG) == PriorityClass.INTERACTIVE
        if not lead_ids and not open_to_joins:
            # A retry of a run killed after it stored everything it was handed: nothing is owed. (An
            # interactive one still looks for fresh leads joined to it while it is open: see RunWork.)
            context.log.info("nothing left to collect: every lead of this handover is stored, parked or handed on")
            return
        name_leads(context, fleet.store, lead_ids)
        baselines = Baselines(fleet.store, spec)
        checks = PendingChecks(context.instance, spec)
        prices = identity_prices(fleet.store)
        spent = spend_today(fleet.store, fleet.catalog, now=utcnow()).get(spec.name, 0.0)
        past_budget = over_budget(spec, spent) is not None
        lower_cpu_priority_if_background(context.run.tags)
        freeze_startup_objects()
        failures: list[CollectionFailed] = []
        work = RunWork(
            fleet.store, source=spec.name, handover_key=context.run.tags.get(HANDOVER_TAG),
            leads=lead_ids, taken_rows=[member.row_id for member in members if member.row_id is not None],
            collect=lambda lead: _collect_one(fleet, spec, lead, context.run.run_id, background),
            concurrency=spec.concurrency, open_to_joins=open_to_joins,
            on_join=JoinedCases(context, case=context.run.tags.get(CASE_TAG)),
        )
        # Reported as they finish, not at the end: a 90 s batch shows progress in the UI, and a crash
        # midway leaves what was stored materialized.
        finished = 0
        for lead_id, outcome in work.outcomes():
            finished += 1
            if isinstance(outcome, CollectionResult):
                # Stored in the event log before the generator resumes, so its id is known.
                cost = collection_cost_usd(spec, outcome.sent, prices)
                yield materialization(spec, outcome, cost_usd=cost, over_budget=past_budget,
                                      cadence=next_visit(fleet.store, spec, lead_id))
                if judged:
                    checks.add(outcome.partition_key or lead_id,
                               baselines.judge(lead_id, outcome.lead_kind, outcome.records, outcome.common_fields),
                               outcome.sample_keys)
            elif isinstance(outcome, CollectionParked):
                context.log.warning(f"{outcome}; back in the queue")
            else:
                context.log.error(str(outcome))
                failures.append(outcome)
            if checks.due() or work.idle:
                # Idle: an open run may wait LINGER_S for joins; its leads' checks go out before that.
                yield from checks.take()
        yield from checks.take()
        if failures:
            # A permanent failure (4xx, unparseable, refused) is not worth a step retry, and neither
            # is a batch: its failed leads are dead letters already, its good ones are stored.
            raise Failure(
                description=f"{len(failures)} of {finished} collection(s) of {spec.name} failed: {failures[0]}",
                metadata={
                    "failed_leads": MetadataValue.json([f.lead_id for f in failures]),
                    "reason_groups": MetadataValue.json(sorted({f.reason_group for f in failures})),
                    "last_status": failures[0].last_status if failures[0].last_status is not None else -1,
                },
                # A step retry helps only a run launched on its partitions (from the UI): a dispatched
                # run's failed lead is a dead letter already, its queue row closed, so a retry of it
                # would find nothing owed and succeed, hiding the failure.
                allow_retries=len(lead_ids) == 1 and failures[0].retryable and HANDOVER_TAG not in context.run.tags,
            )

    return _collect


# A run tag's value is cut to this length.
TAG_MAX = 1000


def leads_text(lead_ids: Sequence[str], leads: Mapping[str, Lead], *, limit: int = TAG_MAX) -> str:
    """The leads as investigators type them (`domain:example.com`), in order, at most `limit`
    characters: those that do not fit are counted (`+ 290 more`)."""
    names = [f"{lead.kind}:{lead.value}" if (lead := leads.get(lead_id)) else lead_id for lead_id in lead_ids]
    text = ""
    for shown, name in enumerate(names):
        rest = len(names) - shown - 1
        candidate = f"{text}, {name}" if text else name
        if len(candidate) + (len(f", + {rest} more") if rest else 0) > limit:
            return f"{text}, + {len(names) - shown} more" if text else f"+ {len(names)} leads"
        text = candidate
    return text


def name_leads(context: AssetExecutionContext, store: StateStore, lead_ids: Sequence[str]) -> None:
    """Tag a run of several leads with their values (LEADS_TAG): a dispatched batch covers a partition
    range that holds other leads too, and a UI backfill's run otherwise names no lead at all. A run of one lead names it otherwise (the
    dispatcher's `investigations/lead`, or its partition)."""
    if len(lead_ids) < 2:
        return
    # A name takes at least 7 characters with its separator (`org:x, `): no more than these can be shown.
    shown = store.get_leads(lead_ids[:TAG_MAX // 7 + 1])
    context.instance.add_run_tags(context.run.run_id, {LEADS_TAG: leads_text(lead_ids, shown)})


class JoinedCases:
    """Tells the run's tags (JOINED_CASES_TAG) and log of the other cases whose fresh leads joined it."""

    def __init__(self, context: AssetExecutionContext, *, case: str | None) -> None:
        self._context, self._case = context, case
        self._cases: list[str] = []

    def __call__(self, rows: list[QueuedCollection]) -> None:
        self._context.log.info(f"{len(rows)} fresh lead(s) joined this run: "
                               + ", ".join(f"{row.lead_id} (case {row.case_id})" for row in rows[:10]))
        new = [case for case in dict.fromkeys(row.case_id for row in rows if row.case_id)
               if case != self._case and case not in self._cases]
        if new:
            self._cases.extend(new)
            self._context.instance.add_run_tags(self._context.run.run_id,
                                                {JOINED_CASES_TAG: ", ".join(self._cases)[:TAG_MAX]})


_frozen_in: int | None = None  # the process that froze its startup objects


def freeze_startup_objects() -> None:
    """Leave what the run worker holds before its first collection out of Python's full garbage
    collections (`gc.freeze`): Dagster, the definitions and the run's context, some 200,000 objects.
    A full collection walks every tracked object with every thread stopped: about 100 ms here, often
    enough to stall a batch's sends (gaps of 60-140 ms at 30 r/s). What the collections allocate is
    still collected; only these long-lived objects are no longer walked. Once per process (a worker
    forked from the run launcher's template inherits what the template froze, and freezes its own
    run's objects on top)."""
    global _frozen_in
    if _frozen_in != os.getpid():
        # Not collected first: that full collection would itself delay the first request by as much.
        gc.freeze()
        _frozen_in = os.getpid()


@dataclass(frozen=True)
class Member:
    """A lead the run collects, and the queue row it was handed over in (None: launched from the UI)."""

    lead_id: str
    row_id: int | None = None


def batch_members(context: AssetExecutionContext, fleet: FleetResource) -> list[Member]:
    """The leads this run collects: those the dispatcher handed it that it still owes (a retried
    step or run skips what an earlier attempt finished, and takes what was joined to the run before
    it died), fresh leads joined to it first; else every partition of the run (a lead or a range
    launched from the UI)."""
    handover = context.run.tags.get(HANDOVER_TAG)
    if not handover:
        return [Member(lead_id_of_partition(key)) for key in context.partition_keys]
    rows = fleet.store.handover_rows(handover)
    # Fresh leads joined before the run started (dispatched after its own leads) go first, as they
    # would had they joined it while it ran: each joined so as not to wait behind a batch.
    handed = min((row.dispatched_at for row in rows if row.dispatched_at), default=None)
    rows.sort(key=lambda row: row.dispatched_at == handed)
    return [Member(row.lead_id, row.id) for row in rows]


def _collect_one(
    fleet: FleetResource, spec: SourceSpec, lead_id: str, run_id: str, background: bool
) -> CollectionResult | CollectionParked | CollectionFailed:
    try:
        return fleet.collect(spec.name, lead_id, run_id=run_id, background=background)
    except (CollectionParked, CollectionFailed) as outcome:
        return outcome
