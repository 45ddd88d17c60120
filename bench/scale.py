"""The product at scale: a million leads, a long history, and what an investigator and an operator wait for.

One fleet is deployed on loopback as `bench.case` deploys it (docs/deploying.md): the project's code
server as a service of its own (`dagster code-server start`), `dagster-daemon` and `dagster-webserver`
on `deploy/workspace.yaml`, the webhook intake and the sandbox web (`bench.fleet_process`), in temp
dirs with free ports; Dagster's storage and the state store are SQLite (the embedded default), or
with `--postgres` fresh databases on the bench's Postgres server (dropped after).

Its sources file is made for the bench: `--sources` copies of the sandbox's `robust` source named
`src01`, `src02`, ..., each taking domain leads (`scale_sources_yaml`).

Set-up, through the user's own paths, before any fleet process starts (a user may do all of it first):

1. `investigations leads add --file F --case archive` with `--leads - --active` domain leads, then
   `investigations cases close archive`; `investigations leads add --file F --case open-NN` for the
   `--active` leads, split over ten open cases. Each command's wall time is printed.
2. A history of `--history` materializations over the active leads' partitions, spread evenly over
   the sources (`history_pairs`): collecting them for real would take hours, so they are written
   with Dagster's `DagsterInstance.report_runless_asset_event(AssetMaterialization(asset_key=...,
   partition=...))`, on an instance whose storage connections are held as a run worker's are
   (`resources.dagster_internals.hold_connections_for_the_run`: about 1 ms an event on SQLite, not 9).
   Materializations only: the check results a real collection writes beside them are left out.

Then the services start (the daemon last) and the bench measures, one after the other:

- partitions: from the daemon's start until Dagster's `leads` partitions
  (`instance.get_dynamic_partitions("leads")`) hold every active lead and none of the closed case's
  (other keys the fleet added itself, a canary's lead say, are counted apart); then until the
  lifecycle has retired every lead of the closed case in the state store (`leads.retired_at`; they
  were never partitions here), some 5 minutes after the close (`--retire-timeout-s` bounds the wait).
- idle CPU: `--quiet-s` seconds with no lead sent; the CPU of the daemon's and the code server's
  process trees (sensor ticks, schedules, any run they start) from /proc (`CpuSampler`), in cores;
  the webserver, intake and sandbox apart. Goal <= 0.2 core.
- the UI: the GraphQL documents Dagster 1.13's UI sends (kept below, each named by the UI query it
  mirrors, taken from its webapp bundle and from what the UI sent when its pages were opened), sent
  to the real webserver over HTTP, `--queries` times per view: the Asset Catalog (`AssetRecordsQuery`,
  then `AssetGraphLiveQuery`, `AssetsFreshnessInfoQuery` and `AssetStaleStatusDataQuery` for every
  asset, 10 assets a request as the UI batches them: partition stats, check statuses, latest runs)
  and one source's page on its Partitions tab (`AssetViewDefinitionQuery`,
  `AssetOverviewMetadataEventsQuery`, `PartitionHealthQuery`: every partition key and the
  materialized / failed ones, and the three live queries for it). A view's requests go out at
  once over 6 connections, as a browser sends them; a view's time is until its last answer. p50 /
  p95 / max, the first (cold) apart. Goal p95 <= 2 s. After the fresh leads below joined the
  partitions, each view once more (Dagster's partition status cache is keyed by the partition keys).
- the same pages in headless Chromium (when a `chromium` is on the PATH; driven over its DevTools
  protocol): navigation start until the page's data answered (the catalog: every asset's
  `AssetGraphLiveQuery`; the source page: its `PartitionHealthQuery`, definition and live data),
  `--browser-loads` times each, the first with a cold browser cache. Without Chromium: the page's
  HTML alone, beside the view's GraphQL above.
- fresh leads: `--fresh` single-lead signed webhooks (interactive, to `src01`, each its own case),
  `--fresh-gap-s` apart; from each 202 to the sandbox's first request for the lead (`ArrivalLog`).
  p50 / p95 / max, a lead not reached within 60 s counted at the time waited as a lower bound.
  Goal p95 <= 4 s.
- a `--case-leads` case (default 10,000) in signed deliveries of 1,000 leads each (the intake's
  largest), interactive (the case system's default), for every source: from the first send until
  the state store's backlog (`collection_queue`) holds all leads x sources collections of the case
  (and until every lead is one of Dagster's partitions). Goal <= 30 s. The collections need not run.
- the new-lead sensor's ticks (`instance.get_ticks` of `new_leads`), per phase of the bench: a tick
  with nothing to do waits up to 28.5 s for the inbox by design, so its wall time is mostly waiting;
  what can be told apart is shown: the time a tick ran past that wait, the wall time of the ticks
  that handed over runs (which includes waiting for the lead that woke them), and the lifecycle
  passes, from their log line (`lead partitions: N retired ...`: seconds from the tick's start).
  The fleet stops the daemon first; a tick still running then is left out.

The bench asserts nothing; goals are reported as met or not met.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import (
    RESULTS_DIR,
    bench_workdir,
    dagster_postgres_storage,
    engine_digest,
    find_tool,
    fmt,
    fresh_databases,
    host_load,
    pg_server_pid,
    pg_url,
    print_table,
    write_results,
)
from bench.fleet_process import BIN, ROOT, START_TIMEOUT_S, CpuSampler, Fleet, prepare_fleet, start_fleet
from investigations.intake.leads import lead_id_of_partition

NAME = "scale"
DEFAULT_LEADS = 1_000_000
DEFAULT_ACTIVE = 100_000
DEFAULT_HISTORY = 200_000
DEFAULT_SOURCES = 10
DEFAULT_QUERIES = 10
DEFAULT_QUIET_S = 120.0
DEFAULT_FRESH = 20
DEFAULT_FRESH_GAP_S = 3.0
DEFAULT_CASE_LEADS = 10_000
DEFAULT_BROWSER_LOADS = 3
DEFAULT_SYNC_TIMEOUT_S = 900.0
DEFAULT_RETIRE_TIMEOUT_S = 3600.0
DEFAULT_CASE_TIMEOUT_S = 600.0
TEMPLATE_SOURCE = "robust"  # the sandbox source every bench source copies
ARCHIVE_CASE = "archive"
ACTIVE_CASES = 10  # the active leads are split over this many open cases
DELIVERY_LEADS = 1000  # the intake's largest delivery (investigations.intake.app.DEFAULT_MAX_LEADS)
CASE_PRIORITY = "interactive"  # what the case system sends unless it says otherwise
FRESH_PREFIX = "scale-fresh-"  # the sandbox notes the first request for every lead value with it
FRESH_WAIT_S = 60.0  # after the last fresh 202, the bench waits at most this long for first requests
GOAL_QUERY_P95_S = 2.0
GOAL_IDLE_CORES = 0.2
GOAL_FRESH_P95_S = 4.0
GOAL_CASE_QUEUED_S = 30.0
UI_BATCH = 10  # the UI asks for the live data of at most 10 assets per request
UI_CONNECTIONS = 6  # a browser's connections per host
QUERY_TIMEOUT_S = 300.0
POLL_S = 1.0
STALL_S = 3.0  # a page whose data stopped growing this long (its clock) is as loaded as it gets
HISTORY_PROGRESS = 10  # progress lines while the history is written
CATALOG_PATH = "/assets"
LIFECYCLE_LINE = re.compile(r"lead partitions: (\d+) retired, (\d+) brought back")


# -- the GraphQL documents of Dagster 1.13's UI ------------------------------------------------------
#
# As the UI sends them (its webapp bundle, `dagster_webserver/webapp`, and the requests it sent when
# the pages were opened), without the `__typename` Apollo adds to every selection. A document is an
# operation and every fragment it spreads (`document`).

OPERATIONS = {
    "AssetRecordsQuery": (
        "query AssetRecordsQuery($cursor: String, $limit: Int) { assetRecordsOrError(cursor: $cursor, limit: "
        "$limit) { ...PythonErrorFragment ... on AssetRecordConnection { assets { id key { path } } cursor } } }"
    ),
    "AssetGraphLiveQuery": (
        "query AssetGraphLiveQuery($assetKeys: [AssetKeyInput!]!) { assetNodes(assetKeys: $assetKeys, "
        "loadMaterializations: true) { id ...AssetNodeLiveFragment } assetsLatestInfo(assetKeys: $assetKeys) { id "
        "...AssetLatestInfoFragment } }"
    ),
    "AssetsFreshnessInfoQuery": (
        "query AssetsFreshnessInfoQuery($assetKeys: [AssetKeyInput!]!) { assetNodes(assetKeys: $assetKeys) { id "
        "assetKey { path } freshnessInfo { ...AssetNodeLiveFreshnessInfoFragment } } }"
    ),
    "AssetStaleStatusDataQuery": (
        "query AssetStaleStatusDataQuery($assetKeys: [AssetKeyInput!]!) { assetNodes(assetKeys: $assetKeys) { id "
        "...AssetStaleDataFragment } }"
    ),
    "AssetViewDefinitionQuery": (
        "query AssetViewDefinitionQuery($assetKey: AssetKeyInput!) { assetOrError(assetKey: $assetKey) { ... on "
        "Asset { id key { path } hasDefinitionOrRecord assetMaterializations(limit: 1) { timestamp runId } "
        "definition { id ...AssetViewDefinitionNode } } } }"
    ),
    "AssetOverviewMetadataEventsQuery": (
        "query AssetOverviewMetadataEventsQuery($assetKey: AssetKeyInput!) { assetOrError(assetKey: $assetKey) { "
        "... on Asset { id assetMaterializations(limit: 1) { timestamp runId partition metadataEntries { "
        "...MetadataEntryFragment } } assetObservations(limit: 1) { timestamp runId partition metadataEntries { "
        "...MetadataEntryFragment } } } } }"
    ),
    "PartitionHealthQuery": (
        "query PartitionHealthQuery($assetKey: AssetKeyInput!) { assetNodeOrError(assetKey: $assetKey) { ... on "
        "AssetNode { id partitionKeysByDimension { name type partitionKeys } assetPartitionStatuses { ... on "
        "TimePartitionStatuses { ranges { status startTime endTime startKey endKey } } ... on "
        "DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions } ... on "
        "MultiPartitionStatuses { primaryDimensionName ranges { primaryDimStartKey primaryDimEndKey "
        "primaryDimStartTime primaryDimEndTime secondaryDim { ... on TimePartitionStatuses { ranges { status "
        "startTime endTime startKey endKey } } ... on DefaultPartitionStatuses { materializedPartitions "
        "materializingPartitions failedPartitions } } } } } } } }"
    ),
}
FRAGMENTS = {
    "AssetCheckLiveFragment": (
        "fragment AssetCheckLiveFragment on AssetCheck { name canExecuteIndividually "
        "executionForLatestMaterialization { id runId status timestamp stepKey evaluation { severity } } "
        "partitionDefinition { name description } partitionStatuses { ... on AssetCheckDefaultPartitionStatuses { "
        "succeededPartitions failedPartitions inProgressPartitions skippedPartitions executionFailedPartitions } "
        "... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } } ... on "
        "AssetCheckMultiPartitionStatuses { primaryDimensionName ranges { primaryDimStartKey primaryDimEndKey "
        "secondaryDim { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions "
        "inProgressPartitions skippedPartitions executionFailedPartitions } ... on "
        "AssetCheckTimePartitionStatuses { ranges { startKey endKey status } } } } } } }"
    ),
    "AssetLatestInfoFragment": (
        "fragment AssetLatestInfoFragment on AssetLatestInfo { id assetKey { path } unstartedRunIds "
        "inProgressRunIds latestRun { id ...AssetLatestInfoRun } }"
    ),
    "AssetLatestInfoRun": (
        "fragment AssetLatestInfoRun on Run { status startTime endTime id }"
    ),
    "AssetNodeConfigFragment": (
        "fragment AssetNodeConfigFragment on AssetNode { id configField { name isRequired configType { "
        "...ConfigTypeSchemaFragment recursiveConfigTypes { ...ConfigTypeSchemaFragment } } } }"
    ),
    "AssetNodeFragment": (
        "fragment AssetNodeFragment on AssetNode { id graphName hasMaterializePermission hasWipePermission "
        "jobNames changedReasons opNames description computeKind isPartitioned isObservable isMaterializable "
        "isAutoCreatedStub owners { ... on TeamAssetOwner { team } ... on UserAssetOwner { email } } assetKey { "
        "...AssetNodeKey } tags { key value } kinds }"
    ),
    "AssetNodeInstigatorsFragment": (
        "fragment AssetNodeInstigatorsFragment on AssetNode { id targetingInstigators { ... on Schedule { "
        "...ScheduleSwitchFragment } ... on Sensor { ...SensorSwitchFragment } } }"
    ),
    "AssetNodeKey": (
        "fragment AssetNodeKey on AssetKey { path }"
    ),
    "AssetNodeLiveFragment": (
        "fragment AssetNodeLiveFragment on AssetNode { id opNames repository { id } assetKey { path } "
        "assetMaterializations(limit: 1) { ...AssetNodeLiveMaterialization } assetObservations(limit: 1) { "
        "...AssetNodeLiveObservation } assetChecksOrError { ... on AssetChecks { checks { "
        "...AssetCheckLiveFragment } } } partitionStats { numMaterialized numMaterializing numPartitions "
        "numFailed } }"
    ),
    "AssetNodeLiveFreshnessInfoFragment": (
        "fragment AssetNodeLiveFreshnessInfoFragment on AssetFreshnessInfo { currentMinutesLate }"
    ),
    "AssetNodeLiveMaterialization": (
        "fragment AssetNodeLiveMaterialization on MaterializationEvent { timestamp runId stepKey }"
    ),
    "AssetNodeLiveObservation": (
        "fragment AssetNodeLiveObservation on ObservationEvent { timestamp runId stepKey }"
    ),
    "AssetNodeOpMetadataFragment": (
        "fragment AssetNodeOpMetadataFragment on AssetNode { id metadataEntries { ...MetadataEntryFragment } type "
        "{ ...DagsterTypeFragment } }"
    ),
    "AssetStaleDataFragment": (
        "fragment AssetStaleDataFragment on AssetNode { id assetKey { path } staleStatus staleCauses { key { path "
        "} reason category dependency { path } } }"
    ),
    "AssetViewDefinitionNode": (
        "fragment AssetViewDefinitionNode on AssetNode { id pools opVersion groupName isExecutable "
        "automationCondition { label expandedLabel } partitionDefinition { description dimensionTypes { type "
        "dynamicPartitionsDefinitionName } } partitionKeysByDimension { name } owners { ... on TeamAssetOwner { "
        "team } ... on UserAssetOwner { email } } autoMaterializePolicy { rules { className description "
        "decisionType } } freshnessPolicy { maximumLagMinutes cronSchedule cronScheduleTimezone } "
        "internalFreshnessPolicy { ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } ... "
        "on CronFreshnessPolicy { deadlineCron lowerBoundDeltaSeconds timezone } } backfillPolicy { description } "
        "opTags { key value } requiredResources { resourceKey } repository { id name location { id name } } "
        "hasReportRunlessAssetEventPermission ...AssetNodeFragment ...AssetNodeConfigFragment "
        "...AssetNodeInstigatorsFragment ...UnderlyingOpsAssetNodeFragment ...AssetNodeOpMetadataFragment }"
    ),
    "ConfigTypeSchemaFragment": (
        "fragment ConfigTypeSchemaFragment on ConfigType { ... on EnumConfigType { givenName values { value "
        "description } } ... on RegularConfigType { givenName } key description isSelector typeParamKeys ... on "
        "CompositeConfigType { fields { name description isRequired configTypeKey defaultValueAsJson } } ... on "
        "ScalarUnionConfigType { scalarTypeKey nonScalarTypeKey } ... on MapConfigType { keyLabelName } }"
    ),
    "ConstraintsForTableColumn": (
        "fragment ConstraintsForTableColumn on TableColumnConstraints { nullable unique other }"
    ),
    "DagsterTypeFragment": (
        "fragment DagsterTypeFragment on DagsterType { ...InnerDagsterTypeFragment innerTypes { "
        "...InnerDagsterTypeFragment } }"
    ),
    "InnerDagsterTypeFragment": (
        "fragment InnerDagsterTypeFragment on DagsterType { key name displayName description isNullable isList "
        "isBuiltin isNothing metadataEntries { ...MetadataEntryFragment } inputSchemaType { "
        "...ConfigTypeSchemaFragment recursiveConfigTypes { ...ConfigTypeSchemaFragment } } outputSchemaType { "
        "...ConfigTypeSchemaFragment recursiveConfigTypes { ...ConfigTypeSchemaFragment } } }"
    ),
    "MetadataEntryFragment": (
        "fragment MetadataEntryFragment on MetadataEntry { label description ... on PathMetadataEntry { path } "
        "... on NotebookMetadataEntry { path } ... on JsonMetadataEntry { jsonString } ... on UrlMetadataEntry { "
        "url } ... on TextMetadataEntry { text } ... on MarkdownMetadataEntry { mdStr } ... on "
        "PythonArtifactMetadataEntry { module name } ... on FloatMetadataEntry { floatValue } ... on "
        "TimestampMetadataEntry { timestamp } ... on IntMetadataEntry { intValue intRepr } ... on "
        "BoolMetadataEntry { boolValue } ... on PipelineRunMetadataEntry { runId } ... on AssetMetadataEntry { "
        "assetKey { path } } ... on JobMetadataEntry { jobName repositoryName locationName } ... on "
        "TableColumnLineageMetadataEntry { lineage { columnName columnDeps { assetKey { path } columnName } } } "
        "... on TableMetadataEntry { ...TableMetadataEntryFragment } ... on TableSchemaMetadataEntry { "
        "...TableSchemaForMetadataEntry } ... on CodeReferencesMetadataEntry { codeReferences { ... on "
        "LocalFileCodeReference { filePath lineNumber label } ... on UrlCodeReference { url label } } } ... on "
        "PoolMetadataEntry { pool } }"
    ),
    "PythonErrorChain": (
        "fragment PythonErrorChain on ErrorChainLink { isExplicitLink error { message stack } }"
    ),
    "PythonErrorFragment": (
        "fragment PythonErrorFragment on PythonError { message stack errorChain { ...PythonErrorChain } }"
    ),
    "ScheduleSwitchFragment": (
        "fragment ScheduleSwitchFragment on Schedule { id name cronSchedule executionTimezone scheduleState { id "
        "selectorId status hasStartPermission hasStopPermission } }"
    ),
    "SensorSwitchFragment": (
        "fragment SensorSwitchFragment on Sensor { id name sensorState { id selectorId status typeSpecificData { "
        "... on SensorData { lastCursor } } hasStartPermission hasStopPermission } sensorType }"
    ),
    "TableMetadataEntryFragment": (
        "fragment TableMetadataEntryFragment on TableMetadataEntry { label table { records schema { "
        "...TableSchemaFragment } } }"
    ),
    "TableSchemaForMetadataEntry": (
        "fragment TableSchemaForMetadataEntry on TableSchemaMetadataEntry { schema { ...TableSchemaFragment } }"
    ),
    "TableSchemaFragment": (
        "fragment TableSchemaFragment on TableSchema { columns { name description type tags { key value } "
        "constraints { ...ConstraintsForTableColumn } } constraints { other } }"
    ),
    "UnderlyingOpsAssetNodeFragment": (
        "fragment UnderlyingOpsAssetNodeFragment on AssetNode { id assetKey { path } graphName opNames jobNames }"
    ),
}
# Live data the UI asks for every asset it shows, UI_BATCH assets a request.
LIVE_QUERIES = ("AssetGraphLiveQuery", "AssetsFreshnessInfoQuery", "AssetStaleStatusDataQuery")
# A source's page on its Partitions tab: the definition, the latest event, every partition's status.
PAGE_QUERIES = ("AssetViewDefinitionQuery", "AssetOverviewMetadataEventsQuery", "PartitionHealthQuery")
VIEWS = {"catalog": "Asset Catalog (every asset's partition stats, checks, latest run)",
         "asset_page": "a source's page, Partitions tab (its partition keys and statuses)"}


def document(operation: str) -> str:
    """The operation's text and every fragment it spreads, each once (as the UI's `gql` composes it)."""
    parts, todo, seen = [OPERATIONS[operation]], [OPERATIONS[operation]], set()
    while todo:
        for name in re.findall(r"\.\.\.([A-Za-z_]\w*)", todo.pop()):
            if name not in seen:
                seen.add(name)
                parts.append(FRAGMENTS[name])
                todo.append(FRAGMENTS[name])
    return "\n".join(parts)


def chunked(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[start:start + size]) for start in range(0, len(items), size)]


def view_requests(view: str, asset_keys: Sequence[Sequence[str]], page_key: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """The (operation, variables) a view sends when it opens: the catalog asks for every asset's live
    data UI_BATCH assets at a time (in the order it lists them); the source's page for its own."""
    if view == "catalog":
        keys = sorted(asset_keys, key="/".join)
        requests: list[tuple[str, dict[str, Any]]] = [("AssetRecordsQuery", {"limit": 1000})]
        for chunk in chunked(keys, UI_BATCH):
            variables = {"assetKeys": [{"path": list(key)} for key in chunk]}
            requests += [(operation, variables) for operation in LIVE_QUERIES]
        return requests
    key = {"path": list(page_key)}
    return ([(operation, {"assetKey": key}) for operation in PAGE_QUERIES]
            + [(operation, {"assetKeys": [key]}) for operation in LIVE_QUERIES])


# -- pure parts (tests/bench/test_scale_bench.py) -------------------------------------------------


def source_names(count: int) -> list[str]:
    return [f"src{n:02d}" for n in range(1, count + 1)]


def scale_sources_yaml(count: int, repo_sources: str) -> str:
    """The bench's sources file: the repo's `defaults` and `count` copies of its sandbox source
    `robust` (a JSON lookup taking domain leads, among others) named src01, src02, ..."""
    config = yaml.safe_load(repo_sources)
    template = next(entry for entry in config["sources"] if entry["name"] == TEMPLATE_SOURCE)
    sources = []
    for name in source_names(count):
        entry = copy.deepcopy(template)
        entry["name"] = name
        entry["description"] = f"A copy of the sandbox's `{TEMPLATE_SOURCE}` source (bench.scale)."
        sources.append(entry)
    return yaml.safe_dump({"defaults": config.get("defaults", {}), "sources": sources}, sort_keys=False)


def split_counts(total: int, parts: int) -> list[int]:
    """`total` split over `parts` as evenly as whole numbers go, the larger shares first."""
    base, extra = divmod(total, parts)
    return [base + (1 if n < extra else 0) for n in range(parts)]


@dataclass(frozen=True)
class LeadFile:
    """One `investigations leads add --file` call: its case and the leads it registers."""

    case_id: str
    prefix: str
    count: int

    def lines(self) -> Iterator[str]:
        for n in range(self.count):
            yield f"domain {self.prefix}-{n:07d}.example"


def lead_files(leads: int, active: int, cases: int = ACTIVE_CASES) -> list[LeadFile]:
    """The archive's file (every lead but the active ones), then one file per open case."""
    if not 0 < active <= leads:
        raise ValueError(f"--active must be between 1 and --leads ({leads}), not {active}")
    files = [LeadFile(ARCHIVE_CASE, "arch", leads - active)] if leads > active else []
    shares = [share for share in split_counts(active, min(cases, active)) if share]
    return files + [LeadFile(f"open-{n:02d}", f"open{n:02d}", share) for n, share in enumerate(shares, start=1)]


def history_pairs(count: int, lead_ids: Sequence[str], sources: Sequence[str]) -> Iterator[tuple[str, str]]:
    """`count` distinct (source, lead) pairs, at most leads x sources, spread evenly: the k-th is lead
    k mod A on source (k div A + k mod A) mod S, so every lead gets a turn before any gets a second,
    and each source as many as the next."""
    leads, width = len(lead_ids), len(sources)
    for k in range(min(count, leads * width)):
        rounds, lead = divmod(k, leads)
        yield sources[(rounds + lead) % width], lead_ids[lead]


def nearest_rank(values: Iterable[float], p: float) -> float | None:
    """The nearest-rank percentile (p in [0, 1]): the ceil(p x n)-th smallest value; None for none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def summary(values: Sequence[float]) -> dict[str, Any]:
    """n, p50, p95 and max, nearest rank (p95 of 10 values is the 10th: the largest)."""
    return {"n": len(values), "p50": nearest_rank(values, 0.50), "p95": nearest_rank(values, 0.95),
            "max": max(values) if values else None}


def verdict(value: float | None, goal: float, *, lower_bound: bool = False) -> str:
    """`met` (known and within the goal), `NOT met` (above it, known or a lower bound), `-` (unknown)."""
    if value is None:
        return "-"
    if value > goal:
        return "NOT met"
    return "-" if lower_bound else "met"


def lifecycle_of(message: str) -> tuple[int, int] | None:
    """(retired, brought back) from a lifecycle pass's log line, or None for another line."""
    found = LIFECYCLE_LINE.search(message)
    return (int(found[1]), int(found[2])) if found else None


@dataclass(frozen=True)
class Tick:
    """One tick of the new-lead sensor, from Dagster's tick record and its captured log."""

    start_s: float
    end_s: float | None
    status: str  # success | skipped | failure | started
    runs: int
    lifecycle_s: float | None = None  # from the tick's start to its lifecycle log line
    retired: int = 0
    revived: int = 0


def tick_figures(ticks: Sequence[Tick], phases: Sequence[tuple[str, float, float]], wait_s: float) -> dict[str, Any]:
    """Per phase (name, from, to; a tick belongs to the phase it started in): ticks by status, the
    wall time of those that handed over runs, how long the others ran past their `wait_s` wait for
    the inbox, and the lifecycle passes (seconds from the tick's start to their log line)."""
    out: dict[str, Any] = {}
    for name, start, end in phases:
        mine = [t for t in ticks if start <= t.start_s < end and t.end_s is not None]
        with_runs = [t.end_s - t.start_s for t in mine if t.runs]  # type: ignore[operator]
        waited = [max(0.0, t.end_s - t.start_s - wait_s) for t in mine if not t.runs]  # type: ignore[operator]
        passes = [t for t in mine if t.lifecycle_s is not None]
        out[name] = {
            "seconds": end - start, "ticks": len(mine), "by_status": dict(Counter(t.status for t in mine)),
            "wall_s": summary([t.end_s - t.start_s for t in mine]),  # type: ignore[operator]
            "with_runs_wall_s": summary(with_runs),
            "past_the_wait_s": summary(waited),
            "lifecycle_s": summary([t.lifecycle_s for t in passes]),  # type: ignore[misc]
            "lifecycle_retired": sum(t.retired for t in passes),
            "lifecycle_revived": sum(t.revived for t in passes),
        }
    return out


def _cell(cell: Mapping[str, Any] | None) -> tuple[float | None, bool]:
    """(seconds, lower bound) of a `bench.case.latency_summary` cell."""
    return (None, False) if not cell else (cell["s"], bool(cell["lower_bound"]))


def _secs(value: float | None, lower_bound: bool = False, digits: int = 2) -> str:
    return "-" if value is None else f"{'>' if lower_bound else ''}{value:.{digits}f} s"


def goal_rows(figures: Mapping[str, Any]) -> list[list[str]]:
    """The final table: (what, measured, goal, verdict), one row per figure the issue asks for."""
    rows: list[list[str]] = []
    for setup in figures.get("setup", {}).get("files", []):
        rows.append([f"`leads add --file` {setup['leads']:,} leads, case {setup['case_id']}",
                     _secs(setup["wall_s"], digits=1), "-", "report"])
    close = figures.get("setup", {}).get("close")
    if close:
        rows.append([f"`cases close {ARCHIVE_CASE}`", _secs(close["wall_s"], digits=1), "-", "report"])
    history = figures.get("history") or {}
    if history:
        rows.append([f"history: {history['written']:,} materializations written (not collected)",
                     _secs(history.get("wall_s"), digits=0), "-", "report"])
    parts = figures.get("partitions") or {}
    exact = parts.get("exact_after_daemon_s")
    rows.append(["partitions hold exactly the active leads, after the daemon started",
                 _secs(exact, lower_bound=exact is not None and not parts.get("exact"), digits=1), "-", "report"])
    retire = figures.get("retire") or {}
    if retire.get("archive"):
        rows.append([f"the closed case's {retire['archive']:,} leads retired, after its close",
                     _secs(retire.get("after_close_s"), lower_bound=not retire.get("done"), digits=0), "-", "report"])
    for view, label in (("catalog", "Asset Catalog GraphQL p95"), ("asset_page", "source page GraphQL p95")):
        cell = ((figures.get("queries") or {}).get(view) or {}).get("total_s") or {}
        rows.append([label, _secs(cell.get("p95")), f"<= {GOAL_QUERY_P95_S:g} s",
                     verdict(cell.get("p95"), GOAL_QUERY_P95_S)])
    for view, entry in ((figures.get("browser") or {}).get("pages") or {}).items():
        cell = entry.get("load_s") or {}
        rows.append([f"browser: {view} page loaded, max of {cell.get('n', 0)}", _secs(cell.get("max")),
                     "-", "report"])
    idle = figures.get("idle") or {}
    cores = idle.get("fleet_cores")
    rows.append(["idle CPU, daemon + code server (cores)", "-" if cores is None else f"{cores:.3f}",
                 f"<= {GOAL_IDLE_CORES:g}", verdict(cores, GOAL_IDLE_CORES)])
    ticks = (figures.get("ticks") or {}).get("all") or {}
    past = (ticks.get("past_the_wait_s") or {}).get("p95")
    rows.append(["new_leads ticks with nothing to do: past their inbox wait, p95", _secs(past), "-", "report"])
    lifecycle = (((figures.get("ticks") or {}).get("all") or {}).get("lifecycle_s") or {}).get("max")
    rows.append(["new_leads lifecycle passes, longest (from the tick's start)", _secs(lifecycle), "-", "report"])
    fresh = figures.get("fresh") or {}
    value, bound = _cell((fresh.get("first_request_s") or {}).get("p95"))
    rows.append(["fresh lead: 202 -> first request p95", _secs(value, bound), f"<= {GOAL_FRESH_P95_S:g} s",
                 verdict(value, GOAL_FRESH_P95_S, lower_bound=bound)])
    case = figures.get("case") or {}
    queued = case.get("queued_after_first_send_s")
    rows.append([f"{case.get('leads', 0):,}-lead case: first send -> all collections queued",
                 _secs(queued, lower_bound=not case.get("all_queued"), digits=1), f"<= {GOAL_CASE_QUEUED_S:g} s",
                 verdict(queued, GOAL_CASE_QUEUED_S, lower_bound=not case.get("all_queued"))])
    return rows


# -- set-up through the user's paths ---------------------------------------------------------------


def run_cli(fleet: Fleet, *args: str) -> dict[str, Any]:
    """One `investigations` command with the fleet's environment; its wall time and last output line."""
    started = time.time()
    done = subprocess.run([str(BIN / "investigations"), *args], env=fleet.env, cwd=ROOT, capture_output=True,
                          text=True, check=False)
    wall = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"`investigations {' '.join(args)}` exited with {done.returncode}: {done.stderr[-1000:]}")
    lines = done.stdout.strip().splitlines()
    return {"command": "investigations " + " ".join(args), "wall_s": wall, "said": lines[-1] if lines else ""}


def register_leads(fleet: Fleet, files: Sequence[LeadFile], folder: Path) -> dict[str, Any]:
    """Every lead file through `investigations leads add --file`, then the archive closed."""
    out: dict[str, Any] = {"files": [], "close": None}
    for entry in files:
        path = folder / f"{entry.case_id}.txt"
        with path.open("w") as handle:
            for line in entry.lines():
                handle.write(line + "\n")
        result = run_cli(fleet, "leads", "add", "--file", str(path), "--case", entry.case_id)
        out["files"].append({"case_id": entry.case_id, "leads": entry.count, **result})
        print(f"  leads add --file: {entry.count:,} leads in case {entry.case_id} in {result['wall_s']:.1f} s "
              f"({result['said']})", flush=True)
        if entry.case_id == ARCHIVE_CASE:
            out["close"] = run_cli(fleet, "cases", "close", ARCHIVE_CASE)
            out["closed_at_s"] = time.time()
            print(f"  cases close {ARCHIVE_CASE}: {out['close']['wall_s']:.1f} s ({out['close']['said']})", flush=True)
    return out


def case_leads(fleet: Fleet, cases: Iterable[str]) -> dict[str, list[str]]:
    """The lead ids each case holds, as the state store has them."""
    from investigations.store import StateStore

    store = StateStore.from_url(fleet.database_url)
    try:
        return {case: store.case_lead_ids(case) or [] for case in cases}
    finally:
        store.close()


def partition_keys_of(fleet: Fleet, lead_ids: Sequence[str]) -> dict[str, str]:
    """Each lead's Dagster partition key, by lead id, as the state store has them."""
    from investigations.store import StateStore

    store = StateStore.from_url(fleet.database_url)
    try:
        return store.partition_keys_of(lead_ids)
    finally:
        store.close()


def write_history(fleet: Fleet, count: int, lead_ids: Sequence[str], sources: Sequence[str]) -> dict[str, Any]:
    """`count` materializations over the active leads' partitions (`history_pairs`), reported with
    Dagster's `report_runless_asset_event` on an instance holding its connections as a run worker's."""
    from dagster import AssetMaterialization, DagsterInstance

    from assets.naming import source_asset_key
    from resources.dagster_internals import hold_connections_for_the_run

    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    hold_connections_for_the_run(instance)
    keys = {source: source_asset_key(source) for source in sources}
    partitions = partition_keys_of(fleet, lead_ids)
    pairs = list(history_pairs(count, lead_ids, sources))
    step = max(1, len(pairs) // HISTORY_PROGRESS)
    started = time.time()
    try:
        for n, (source, lead_id) in enumerate(pairs, start=1):
            instance.report_runless_asset_event(AssetMaterialization(asset_key=keys[source],
                                                                     partition=partitions.get(lead_id, lead_id)))
            if n % step == 0 and n < len(pairs):
                print(f"  history: {n:,} of {len(pairs):,} in {time.time() - started:.0f} s", flush=True)
    finally:
        instance.dispose()
    wall = time.time() - started
    print(f"  history: {len(pairs):,} materializations over {len({lead for _, lead in pairs}):,} partitions of "
          f"{len(sources)} sources in {wall:.0f} s (written with report_runless_asset_event; collecting them would "
          "take hours)", flush=True)
    return {"asked": count, "written": len(pairs), "partitions": len({lead for _, lead in pairs}),
            "per_source": dict(Counter(source for source, _ in pairs)), "wall_s": wall,
            "how": "DagsterInstance.report_runless_asset_event(AssetMaterialization(asset_key, partition)), "
                   "connections held as a run worker's; not collected"}


# -- the services ----------------------------------------------------------------------------------


def start_webserver(fleet: Fleet) -> None:
    """`dagster-webserver` on the deployment's workspace, as the webserver service runs it."""
    from investigations.demo.fleet import wait_http

    cmd = [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", fleet.env["INVESTIGATIONS_UI_PORT"],
           "-w", fleet.env["BENCH_WORKSPACE"]]
    with open(fleet.logs / "webserver.log", "wb") as log:
        fleet.procs["webserver"] = subprocess.Popen(cmd, env=fleet.env, cwd=ROOT, start_new_session=True,
                                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    wait_http(f"{fleet.ui_url}/server_info", timeout_s=START_TIMEOUT_S, procs=list(fleet.procs.values()))


def wait_partitions(instance: Any, fleet: Fleet, *, active: set[str], archive: set[str], started_s: float,
                    timeout_s: float) -> dict[str, Any]:
    """Poll the `leads` partitions until they hold every active lead and none of the closed case's."""
    from assets.partitions import LEADS_PARTITIONS

    deadline, next_note = started_s + timeout_s, time.time() + 30
    first_key_s: float | None = None
    keys: set[str] = set()
    while True:
        fleet.check_alive()
        now = time.time()
        try:
            keys = {lead_id_of_partition(key) for key in instance.get_dynamic_partitions(LEADS_PARTITIONS)}
        except Exception:  # SQLite busy while the sensor writes: ask again
            keys = keys or set()
        if keys and first_key_s is None:
            first_key_s = now
        missing, stray = len(active - keys), len(keys & archive)
        exact = not missing and not stray
        if exact or now >= deadline:
            return {"exact": exact, "exact_after_daemon_s": now - started_s,
                    "first_key_after_daemon_s": first_key_s - started_s if first_key_s else None,
                    "partitions": len(keys), "active": len(active), "missing": missing, "closed_case_keys": stray,
                    "other_keys": len(keys - active - archive)}
        if now >= next_note:
            print(f"  partitions: {len(keys):,} ({missing:,} active leads missing, {stray:,} of the closed case) "
                  f"{now - started_s:.0f} s after the daemon started", flush=True)
            next_note += 30
        time.sleep(POLL_S)


def wait_retired(fleet: Fleet, *, archive: int, closed_at_s: float, timeout_s: float) -> dict[str, Any]:
    """Poll the state store until the lifecycle has retired as many leads as the closed case holds."""
    from investigations.store import StateStore

    store = StateStore.from_url(fleet.database_url)
    started, next_note = time.time(), time.time() + 60
    try:
        while True:
            fleet.check_alive()
            counts = store.lead_partition_counts()
            now = time.time()
            if counts["retired"] >= archive or now - started >= timeout_s:
                return {"archive": archive, "done": counts["retired"] >= archive, "retired": counts["retired"],
                        "active": counts["active"], "after_close_s": now - closed_at_s, "waited_s": now - started}
            if now >= next_note:
                print(f"  lifecycle: {counts['retired']:,} of {archive:,} retired, {now - closed_at_s:.0f} s after "
                      "the close", flush=True)
                next_note += 60
            time.sleep(5 * POLL_S)
    finally:
        store.close()


def idle_figures(sampler: CpuSampler, start_s: float, end_s: float) -> dict[str, Any]:
    """CPU over the quiet window: the daemon's and the code server's trees together (the goal), the others apart."""
    window = sampler.window(start_s, end_s)
    seconds = window.get("seconds") or 0.0
    groups = window.get("groups", {})

    def cores(group: str) -> float | None:
        return groups[group] / seconds if seconds and group in groups else None

    return {"window_s": seconds, "fleet_cores": cores("dagster"), "webserver_cores": cores("webserver"),
            "intake_cores": cores("intake"), "sandbox_cores": cores("sandbox"),
            "postgres_cores": cores("postgres"), "cpu_s": groups,
            "roles_cpu_s": window.get("roles", {}), "processes": window.get("processes", {}),
            "machine_cores_busy": window["machine_busy_s"] / seconds if seconds else None}


# -- the UI's GraphQL, over HTTP ----------------------------------------------------------------------


class GraphQL:
    """The webserver's GraphQL endpoint, asked as the UI asks it: a view's requests at once, over
    UI_CONNECTIONS connections."""

    def __init__(self, ui_url: str) -> None:
        self.url = f"{ui_url}/graphql"
        self.client = httpx.Client(trust_env=False, timeout=QUERY_TIMEOUT_S,
                                   limits=httpx.Limits(max_connections=UI_CONNECTIONS,
                                                       max_keepalive_connections=UI_CONNECTIONS))
        self.pool = ThreadPoolExecutor(max_workers=UI_CONNECTIONS, thread_name_prefix="bench-graphql")

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()

    def post(self, operation: str, variables: Mapping[str, Any]) -> tuple[float, str | None]:
        started = time.perf_counter()
        try:
            answer = self.client.post(self.url, json={"operationName": operation, "query": document(operation),
                                                      "variables": dict(variables)})
            took = time.perf_counter() - started
            if answer.status_code != 200:
                return took, f"{operation}: HTTP {answer.status_code}: {answer.text[:200]}"
            errors = answer.json().get("errors")
        except Exception as exc:  # reported with the figures: one failed request must not stop the rounds
            return time.perf_counter() - started, f"{operation}: {type(exc).__name__}: {exc}"[:300]
        return took, f"{operation}: {errors[0].get('message', errors[0])}"[:300] if errors else None

    def asset_keys(self) -> list[list[str]]:
        answer = self.client.post(self.url, json={"query": "query BenchAssetKeys { assetNodes { assetKey { path } } }"})
        answer.raise_for_status()
        return [node["assetKey"]["path"] for node in answer.json()["data"]["assetNodes"]]

    def view(self, requests: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
        """Every request of a view at once; the view's time is until its last answer."""
        started = time.perf_counter()
        results = list(self.pool.map(lambda request: (request[0], *self.post(*request)), requests))
        total = time.perf_counter() - started
        per_op: dict[str, float] = {}
        for operation, took, _ in results:
            per_op[operation] = max(per_op.get(operation, 0.0), took)
        return {"total_s": total, "per_query_s": per_op, "errors": [error for _, _, error in results if error]}


def query_views(gql: GraphQL, keys: Sequence[Sequence[str]], page_key: Sequence[str], rounds: int,
                label: str) -> dict[str, Any]:
    """Each view `rounds` times, the catalog then the source's page in each round."""
    seen: dict[str, list[dict[str, Any]]] = {view: [] for view in VIEWS}
    for n in range(rounds):
        for view in VIEWS:
            seen[view].append(gql.view(view_requests(view, keys, page_key)))
        print(f"  [{label}] round {n + 1}/{rounds}: " + ", ".join(
            f"{view} {seen[view][-1]['total_s']:.2f} s" for view in VIEWS), flush=True)
    out: dict[str, Any] = {}
    for view, rows in seen.items():
        operations = sorted({op for row in rows for op in row["per_query_s"]})
        out[view] = {
            "requests": len(view_requests(view, keys, page_key)), "total_s": summary([r["total_s"] for r in rows]),
            "first_s": rows[0]["total_s"] if rows else None, "all_s": [r["total_s"] for r in rows],
            "per_query_s": {op: summary([r["per_query_s"][op] for r in rows if op in r["per_query_s"]])
                            for op in operations},
            "errors": [error for row in rows for error in row["errors"]][:20],
        }
    return out


# -- the UI in a browser ------------------------------------------------------------------------------


class Chromium:
    """Headless Chromium driven over its DevTools protocol: a page's load timed from the navigation's
    document request until the GraphQL answers that carry the page's data (by the browser's own clock)."""

    def __init__(self, binary: str, folder: Path) -> None:
        self.binary, self.folder = binary, folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.socket: Any = None
        self.stack = contextlib.ExitStack()
        self.pending: list[dict[str, Any]] = []
        self.calls = 0

    def __enter__(self) -> Chromium:
        from websockets.sync.client import connect

        profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=self.folder))
        cmd = [self.binary, "--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
               "--window-size=1600,1600", "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"]
        if os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        try:
            with open(self.folder / "chromium.log", "wb") as log:
                self.proc = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=log)
            port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
            while not (port_file.is_file() and port_file.read_text().strip()):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Chromium did not open its DevTools port (see {self.folder / 'chromium.log'})")
                time.sleep(0.2)
            port = int(port_file.read_text().split()[0])
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", trust_env=False, timeout=10).json()
            page = next(t for t in targets if t.get("type") == "page")
            self.socket = self.stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None,
                                                           open_timeout=30))
            self.call("Network.enable")
            self.call("Page.enable")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        from investigations.demo.fleet import stop_all

        self.stack.close()
        if self.proc is not None:
            stop_all([self.proc], grace_s=5)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls += 1
        ident = self.calls
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            self.pending.append(message)

    def _next(self, timeout_s: float) -> dict[str, Any] | None:
        if self.pending:
            return self.pending.pop(0)
        try:
            return dict(json.loads(self.socket.recv(timeout=timeout_s)))
        except TimeoutError:
            return None

    def load(self, url: str, cover: Callable[[list[tuple[str, dict[str, Any]]]], int], target: int, *,
             timeout_s: float = QUERY_TIMEOUT_S) -> dict[str, Any]:
        """Navigate to `url`; seconds from its document request until `cover(answered)` (the GraphQL
        answered so far, (operation, variables) each) reaches `target`. A page that stops short (the
        catalog asks only for the rows it shows) ends at the answer that last raised it, once it has
        not risen for STALL_S."""
        self.call("Page.navigate", url="about:blank")
        time.sleep(0.5)
        self.pending.clear()
        self.call("Page.navigate", url=url)
        document_s: float | None = None
        sent: dict[str, tuple[str, dict[str, Any]]] = {}
        answered: list[tuple[str, dict[str, Any]]] = []
        covered, covered_s, covered_at = 0, None, time.monotonic()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if covered and time.monotonic() - covered_at > STALL_S and document_s is not None:
                return {"s": covered_s - document_s, "complete": False, "covered": covered, "target": target}
            message = self._next(0.5)
            if message is None:
                continue
            method, params = message.get("method"), message.get("params", {})
            if method == "Network.requestWillBeSent":
                request = params.get("request", {})
                if params.get("type") == "Document" and document_s is None:
                    document_s = params["timestamp"]
                body = _post_data(request)
                if body is not None and "/graphql" in request.get("url", ""):
                    sent[params["requestId"]] = (body.get("operationName") or "", body.get("variables") or {})
            elif method == "Network.loadingFinished" and params.get("requestId") in sent:
                answered.append(sent.pop(params["requestId"]))
                now = cover(answered)
                if now > covered:
                    covered, covered_s, covered_at = now, params["timestamp"], time.monotonic()
                if covered >= target and document_s is not None:
                    return {"s": covered_s - document_s, "complete": True, "covered": covered, "target": target}
        return {"s": None, "complete": False, "covered": covered, "target": target}


def _post_data(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """A request's JSON body, from `postData` or (newer Chromium) `postDataEntries`."""
    import base64

    raw = request.get("postData")
    if raw is None and request.get("postDataEntries"):
        raw = b"".join(base64.b64decode(entry.get("bytes", "")) for entry in request["postDataEntries"]).decode()
    if not raw:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def catalog_cover(answered: list[tuple[str, dict[str, Any]]]) -> int:
    """The catalog's data on screen: the assets whose `AssetGraphLiveQuery` answered."""
    return len({tuple(k["path"]) for op, v in answered if op == "AssetGraphLiveQuery" for k in v.get("assetKeys", [])})


def page_cover(key: Sequence[str]) -> Callable[[list[tuple[str, dict[str, Any]]]], int]:
    """A source's page's data on screen, of 3: its partition health, its definition, its live data."""
    path = list(key)

    def cover(answered: list[tuple[str, dict[str, Any]]]) -> int:
        ops = {op for op, _ in answered}
        live = any(op == "AssetGraphLiveQuery" and any(k["path"] == path for k in v.get("assetKeys", []))
                   for op, v in answered)
        return int(live) + int("PartitionHealthQuery" in ops) + int("AssetViewDefinitionQuery" in ops)

    return cover


def browser_loads(fleet: Fleet, keys: Sequence[Sequence[str]], page_key: Sequence[str], loads: int) -> dict[str, Any]:
    """Each page `loads` times in headless Chromium; without it, the pages' HTML alone."""
    pages = {"catalog": (CATALOG_PATH, catalog_cover, len(keys)),
             "asset_page": (f"/assets/{'/'.join(page_key)}?view=partitions", page_cover(page_key), 3)}
    binary = find_tool("chromium") or find_tool("chromium-browser") or find_tool("google-chrome")
    reason = None if binary else "no chromium on the PATH"
    if binary:
        try:
            import websockets.sync.client  # noqa: F401
        except ImportError:
            reason = "the websockets package is missing (its DevTools protocol is spoken over a WebSocket)"
    if reason is None:
        try:
            out: dict[str, Any] = {"how": "headless Chromium", "pages": {}}
            with Chromium(str(binary), fleet.logs) as browser:
                for view, (path, cover, target) in pages.items():
                    rows = [browser.load(fleet.ui_url + path, cover, target) for _n in range(loads)]
                    times = [row["s"] for row in rows if row["s"] is not None]
                    out["pages"][view] = {"path": path, "loads": rows, "load_s": summary(times),
                                          "first_s": rows[0]["s"] if rows else None}
                    print(f"  browser: {path} loaded in " + ", ".join(_secs(row["s"]) for row in rows), flush=True)
            return out
        except Exception as exc:  # the browser is optional: say why and time the HTML instead
            reason = f"{type(exc).__name__}: {exc}"[:300]
    print(f"  browser: not used ({reason}); timing the pages' HTML alone", flush=True)
    html: dict[str, Any] = {"how": f"page HTML only ({reason}); its GraphQL is timed above", "pages": {}}
    with httpx.Client(trust_env=False, timeout=60) as client:
        for view, (path, _, _) in pages.items():
            times = []
            for _n in range(loads):
                started = time.perf_counter()
                client.get(fleet.ui_url + path).raise_for_status()
                times.append(time.perf_counter() - started)
            html["pages"][view] = {"path": path, "load_s": summary(times), "first_s": times[0] if times else None}
    return html


# -- fresh leads and a big case ---------------------------------------------------------------------


def send_fresh(fleet: Fleet, *, count: int, gap_s: float, source: str, stamp: str) -> dict[str, Any]:
    """`count` single-lead deliveries `gap_s` apart; per lead, from its 202 to the sandbox's first request."""
    from bench.case import latency_summary, within_goal
    from investigations.demo.case import send_case

    sent: list[dict[str, Any]] = []
    secret = fleet.env["INVESTIGATIONS_WEBHOOK_SECRET"]
    start = time.time()
    for n in range(count):
        fleet.sleep_until(start + n * gap_s)
        value = f"{FRESH_PREFIX}{stamp}-{n:02d}.example"
        body = {"case_id": f"scale-fresh-{stamp}-{n:02d}", "leads": [{"kind": "domain", "value": value}],
                "sources": [source], "priority": "interactive"}
        row: dict[str, Any] = {"n": n, "value": value, "sent_s": time.time(), "status": None, "lead_id": None}
        try:
            answer = send_case(fleet.intake_url, secret, body, timeout_s=30.0)
            row["status"] = answer.status_code
            if answer.status_code == 202:
                row["lead_id"] = answer.json()["leads"][0]["lead_id"]
        except httpx.HTTPError as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        row["accepted_s"] = time.time()
        sent.append(row)
    arrivals: dict[str, dict[str, float]] = {}
    last = max((row["accepted_s"] for row in sent), default=time.time())
    with httpx.Client(trust_env=False, timeout=10) as client:
        while True:
            arrivals = client.get(f"{fleet.sandbox_url}/_bench/arrivals").json()
            if all(row["value"] in arrivals for row in sent if row["lead_id"]) or time.time() > last + FRESH_WAIT_S:
                break
            fleet.check_alive()
            time.sleep(0.5)
    end = time.time()
    for row in sent:
        first = min(arrivals.get(row["value"], {}).values(), default=None) if row["lead_id"] else None
        row["first_request_s"] = first - row["accepted_s"] if first is not None else None
        row["waited_s"] = end - row["accepted_s"]
    reached = latency_summary([(row["first_request_s"], row["waited_s"]) for row in sent])
    print(f"  fresh leads: {sum(1 for r in sent if r['first_request_s'] is not None)} of {len(sent)} reached; "
          "202 -> first request " + ", ".join(_secs(r["first_request_s"], digits=1) for r in sent), flush=True)
    return {"source": source, "sent": len(sent), "accepted": sum(1 for r in sent if r["lead_id"]), "gap_s": gap_s,
            "first_request_s": reached, "goal": within_goal(reached["p95"], GOAL_FRESH_P95_S), "leads": sent}


def send_case_in_deliveries(fleet: Fleet, instance: Any, *, leads: int, sources: Sequence[str], stamp: str,
                            timeout_s: float) -> dict[str, Any]:
    """One case of `leads` leads in deliveries of DELIVERY_LEADS, for every source; from the first send
    until its leads x sources collections are all in the backlog, and all its leads are partitions."""
    from sqlalchemy import func, select

    from assets.partitions import LEADS_PARTITIONS
    from investigations.demo.case import send_case
    from investigations.store import StateStore
    from investigations.store import schema as s

    case_id = f"scale-case-{stamp}"
    values = [f"scale-case-{stamp}-{n:05d}.example" for n in range(leads)]
    secret = fleet.env["INVESTIGATIONS_WEBHOOK_SECRET"]
    deliveries: list[dict[str, Any]] = []
    lead_ids: list[str] = []
    first_send = time.time()
    for chunk in chunked(values, DELIVERY_LEADS):
        body = {"case_id": case_id, "leads": [{"kind": "domain", "value": v} for v in chunk],
                "sources": list(sources), "priority": CASE_PRIORITY}
        sent = time.time()
        answer = send_case(fleet.intake_url, secret, body, timeout_s=120.0)
        deliveries.append({"leads": len(chunk), "status": answer.status_code, "answer_s": time.time() - sent})
        if answer.status_code == 202:
            lead_ids += [entry["lead_id"] for entry in answer.json()["leads"]]
    last_202 = time.time()
    wanted = len(lead_ids) * len(sources)
    q = s.collection_queue
    store = StateStore.from_url(fleet.database_url)
    queued, queued_s, joined_s, next_note = 0, None, None, first_send + 30
    try:
        while time.time() < first_send + timeout_s:
            fleet.check_alive()
            now = time.time()
            with store.engine.begin() as conn:
                queued = int(conn.execute(select(func.count()).select_from(q).where(q.c.case_id == case_id)).scalar() or 0)
            if queued >= wanted and queued_s is None:
                queued_s = now
            if joined_s is None and set(lead_ids) <= {lead_id_of_partition(key) for key in
                                                      instance.get_dynamic_partitions(LEADS_PARTITIONS)}:
                joined_s = time.time()
            if queued_s is not None and joined_s is not None:
                break
            if now >= next_note:
                print(f"  case: {queued:,} of {wanted:,} collections queued {now - first_send:.0f} s after the first "
                      "send", flush=True)
                next_note += 30
            time.sleep(max(0.0, POLL_S - (time.time() - now)))
    finally:
        store.close()
    end = time.time()
    print(f"  case: {len(lead_ids):,} leads in {len(deliveries)} deliveries, last 202 {last_202 - first_send:.1f} s "
          f"after the first send; {queued:,} of {wanted:,} collections queued "
          + (f"{queued_s - first_send:.1f} s after it" if queued_s else f"when the bench gave up ({end - first_send:.0f} s)"),
          flush=True)
    return {"case_id": case_id, "leads": leads, "accepted_leads": len(lead_ids), "sources": len(sources),
            "priority": CASE_PRIORITY, "deliveries": deliveries, "last_202_after_first_send_s": last_202 - first_send,
            "wanted": wanted, "queued": queued, "all_queued": queued_s is not None,
            "queued_after_first_send_s": (queued_s or end) - first_send,
            "partitions_after_first_send_s": (joined_s or end) - first_send, "all_partitions": joined_s is not None,
            "goal": verdict((queued_s or end) - first_send, GOAL_CASE_QUEUED_S, lower_bound=queued_s is None)}


# -- the new-lead sensor's ticks --------------------------------------------------------------------


def read_ticks(instance: Any, since_s: float) -> tuple[list[Tick], str | None]:
    """The new-lead sensor's ticks since `since_s`, with its lifecycle log lines; or why there are none."""
    from dagster._core.scheduler.instigation import InstigatorType

    from sensors.new_leads import NEW_LEAD_SENSOR

    state = next((st for st in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
                  if st.name == NEW_LEAD_SENSOR), None)
    if state is None:
        return [], f"no state for sensor {NEW_LEAD_SENSOR}"
    ticks = []
    for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, after=since_s):
        lifecycle_s, retired, revived = None, 0, 0
        if tick.log_key:
            try:
                data = instance.compute_log_manager.get_log_data(tick.log_key)
            except Exception:  # a tick's log gone or unreadable: its record still counts
                data = None
            for line in ((data.stderr or b"").decode(errors="replace").splitlines() if data else []):
                try:
                    record = json.loads(line, strict=False)
                except ValueError:
                    continue
                found = lifecycle_of(str(record.get("msg", "")))
                if found:
                    lifecycle_s = float(record.get("created", tick.timestamp)) - tick.timestamp
                    retired, revived = found
        ticks.append(Tick(start_s=tick.timestamp, end_s=tick.end_timestamp, status=tick.status.value.lower(),
                          runs=len(tick.run_ids), lifecycle_s=lifecycle_s, retired=retired, revived=revived))
    return sorted(ticks, key=lambda t: t.start_s), None


# -- one run ----------------------------------------------------------------------------------------


def measure(args: argparse.Namespace, workdir: Path, databases: Sequence[str]) -> dict[str, Any]:
    from dagster import DagsterInstance

    from assets.naming import source_asset_key
    from sensors.new_leads import WAIT_FOR_LEADS_S

    sources = source_names(args.sources)
    dagster_yaml = (ROOT / "dagster.yaml").read_text()
    if databases:
        dagster_yaml += "\n" + yaml.safe_dump({"storage": dagster_postgres_storage(databases[1])}, sort_keys=False)
    fleet = prepare_fleet(workdir / "fleet", dagster_yaml=dagster_yaml,
                          sources_yaml=scale_sources_yaml(args.sources, (ROOT / "sources.yaml").read_text()),
                          watch_prefix=FRESH_PREFIX)
    fleet.env["BENCH_WORKSPACE"] = str(ROOT / "deploy" / "workspace.yaml")
    if databases:
        fleet.database_url = fleet.env["INVESTIGATIONS_DATABASE_URL"] = pg_url(databases[0])
    figures: dict[str, Any] = {"errors": []}
    stamp = uuid.uuid4().hex[:6]

    # Dagster's storage first, before the fleet's processes create it concurrently.
    instance = DagsterInstance.from_config(str(fleet.dagster_home))
    instance.get_runs(limit=1)
    print(f"--- set-up: {args.leads:,} leads ({args.leads - args.active:,} in case {ARCHIVE_CASE}, closed; "
          f"{args.active:,} in open cases), {args.sources} sources ---", flush=True)
    files = lead_files(args.leads, args.active)
    figures["setup"] = register_leads(fleet, files, workdir)
    by_case = case_leads(fleet, [entry.case_id for entry in files])
    archive = set(by_case.pop(ARCHIVE_CASE, []))
    active_ids = [lead for case in by_case.values() for lead in case]
    figures["history"] = write_history(fleet, args.history, active_ids, sources)

    print("\n--- the fleet: code server, intake, webserver, then the daemon ---", flush=True)
    sampler: CpuSampler | None = None
    marks: dict[str, float] = {}
    gql: GraphQL | None = None
    try:
        start_fleet(fleet, services=("sandbox",))
        start_fleet(fleet, services=("code-server", "intake"))
        start_webserver(fleet)
        marks["daemon_started"] = time.time()
        start_fleet(fleet, services=("daemon",))
        groups: dict[str, int | tuple[int, ...]] = {
            "dagster": (fleet.procs["daemon"].pid, fleet.procs["code-server"].pid),
            "webserver": fleet.procs["webserver"].pid, "intake": fleet.procs["intake"].pid,
            "sandbox": fleet.procs["sandbox"].pid}
        if databases and (server := pg_server_pid()):
            groups["postgres"] = server  # every backend, live or ended, is the postmaster's child
        sampler = CpuSampler(groups).start()
        print(f"  services up (logs: {fleet.logs})", flush=True)

        figures["partitions"] = wait_partitions(instance, fleet, active=set(active_ids), archive=archive,
                                                started_s=marks["daemon_started"], timeout_s=args.sync_timeout_s)
        marks["partitions"] = time.time()
        part = figures["partitions"]
        print(f"  partitions: {part['partitions']:,} keys, {'exactly' if part['exact'] else 'NOT yet'} the "
              f"{part['active']:,} active leads (+{part['other_keys']} of the fleet's own) "
              f"{part['exact_after_daemon_s']:.1f} s after the daemon started", flush=True)
        if archive and args.retire_timeout_s > 0:
            figures["retire"] = wait_retired(fleet, archive=len(archive), closed_at_s=figures["setup"]["closed_at_s"],
                                             timeout_s=args.retire_timeout_s)
            retire = figures["retire"]
            print(f"  lifecycle: {retire['retired']:,} of {len(archive):,} retired "
                  f"{retire['after_close_s']:.0f} s after the close", flush=True)
        marks["retired"] = time.time()

        print(f"\n--- quiet: {args.quiet_s:g} s, no lead sent ---", flush=True)
        marks["quiet_start"] = time.time()
        fleet.sleep_until(marks["quiet_start"] + args.quiet_s)
        marks["quiet_end"] = time.time()
        figures["idle"] = idle_figures(sampler, marks["quiet_start"], marks["quiet_end"])
        print(f"  daemon + code server: {fmt(figures['idle']['fleet_cores'])} cores", flush=True)

        print(f"\n--- the UI: its GraphQL over HTTP, {args.queries} rounds; then a browser ---", flush=True)
        gql = GraphQL(fleet.ui_url)
        keys = gql.asset_keys()
        page_key = list(source_asset_key(sources[0]).path)
        figures["queries"] = query_views(gql, keys, page_key, args.queries, "graphql")
        figures["queries"]["assets"] = len(keys)
        figures["browser"] = browser_loads(fleet, keys, page_key, args.browser_loads) if args.browser_loads else None

        print(f"\n--- {args.fresh} fresh interactive leads to {sources[0]}, {args.fresh_gap_s:g} s apart ---", flush=True)
        marks["fresh_start"] = time.time()
        figures["fresh"] = send_fresh(fleet, count=args.fresh, gap_s=args.fresh_gap_s, source=sources[0], stamp=stamp)
        figures["queries_after_fresh"] = query_views(gql, keys, page_key, 1, "graphql after the fresh leads joined")

        print(f"\n--- a {args.case_leads:,}-lead case in deliveries of {DELIVERY_LEADS:,} ---", flush=True)
        marks["case_start"] = time.time()
        figures["case"] = send_case_in_deliveries(fleet, instance, leads=args.case_leads, sources=sources, stamp=stamp,
                                                  timeout_s=args.case_timeout_s)
        marks["case_end"] = time.time()
    finally:
        from investigations.demo.fleet import stop_all

        if gql is not None:
            gql.close()
        if sampler is not None:
            sampler.stop()
        # The daemon first: a tick still running when its code server went would fail for that alone.
        marks["stop"] = time.time()
        if "daemon" in fleet.procs:
            stop_all([fleet.procs.pop("daemon")])
        fleet.stop()
    ticks, why = read_ticks(instance, marks["daemon_started"] - 1)
    # A tick the stop cut short is not the fleet's: only those that ended before it count.
    ticks = [tick for tick in ticks if tick.end_s is not None and tick.end_s <= marks["stop"]]
    end = marks.get("case_end", time.time())
    phases = [("start-up", marks["daemon_started"], marks["partitions"]),
              ("retiring", marks["partitions"], marks["retired"]),
              ("quiet", marks["quiet_start"], marks["quiet_end"]),
              ("ui and fresh leads", marks["quiet_end"], marks.get("case_start", end)),
              ("case", marks.get("case_start", end), end)]
    figures["ticks"] = {"wait_for_leads_s": WAIT_FOR_LEADS_S, "note": why,
                        # Each tick: start (s after the daemon started), wall s, status, runs, lifecycle line s.
                        "rows": [[round(t.start_s - marks["daemon_started"], 2), round(t.end_s - t.start_s, 2),
                                  t.status, t.runs, t.lifecycle_s] for t in ticks if t.end_s is not None],
                        "phases": tick_figures(ticks, phases, WAIT_FOR_LEADS_S),
                        "all": tick_figures(ticks, [("all", marks["daemon_started"] - 1, end + 60)], WAIT_FOR_LEADS_S)["all"]}
    figures["marks"] = marks
    figures["errors"] += [e for part in ("queries", "queries_after_fresh") for v in VIEWS
                          for e in (figures.get(part) or {}).get(v, {}).get("errors", [])]
    figures["errors"] += [f"fresh lead {r['n']}: HTTP {r['status']} {r.get('error', '')}".strip()
                          for r in figures["fresh"]["leads"] if not r["lead_id"]]
    figures["errors"] += [f"case delivery {n}: HTTP {d['status']}" for n, d in enumerate(figures["case"]["deliveries"])
                          if d["status"] != 202]
    return figures


# -- report -----------------------------------------------------------------------------------------


def _summary_text(cell: Mapping[str, Any] | None) -> str:
    if not cell or not cell.get("n"):
        return "-"
    return " / ".join(_secs(cell[k]).removesuffix(" s") for k in ("p50", "p95", "max")) + f" ({cell['n']})"


def report(figures: Mapping[str, Any]) -> None:
    cfg = figures["config"]
    queries = figures.get("queries") or {}
    after = figures.get("queries_after_fresh") or {}
    rows: list[list[Any]] = []
    for view, label in VIEWS.items():
        entry = queries.get(view) or {}
        rows.append([f"{view}: {label}", entry.get("requests", "-"), _secs(entry.get("first_s")),
                     _summary_text(entry.get("total_s")), _secs((after.get(view) or {}).get("first_s"))])
        for op, cell in (entry.get("per_query_s") or {}).items():
            rows.append([f"  {op}", "", "", _summary_text(cell), ""])
    print_table(f"The UI's GraphQL over HTTP ({queries.get('assets', '-')} assets; {cfg['queries']} rounds; a view's "
                f"requests at once over {UI_CONNECTIONS} connections)",
                ["view / query", "requests", "first", "p50 / p95 / max (n), s", "after fresh leads"], rows)
    browser = figures.get("browser")
    if browser:
        print(f"\n  browser ({browser['how']}): " + "; ".join(
            f"{view} {entry['path']}: " + ", ".join(_secs(row.get("s")) + ("" if row.get("complete", True) else
                                                                           f" ({row['covered']}/{row['target']})")
                                                    for row in entry.get("loads", []))
            if entry.get("loads") else f"{view} {entry['path']}: {_summary_text(entry['load_s'])}"
            for view, entry in browser["pages"].items()))
    ticks = figures.get("ticks") or {}
    tick_rows = []
    for name, entry in {**(ticks.get("phases") or {}), "all": ticks.get("all") or {}}.items():
        if not entry:
            continue
        tick_rows.append([name, f"{entry['seconds']:.0f}", entry["ticks"],
                          ", ".join(f"{k} {v}" for k, v in sorted(entry["by_status"].items())) or "-",
                          _summary_text(entry["past_the_wait_s"]), _summary_text(entry["with_runs_wall_s"]),
                          _summary_text(entry["lifecycle_s"]), f"{entry['lifecycle_retired']:,}"])
    print_table(f"new_leads ticks (Dagster's tick records; a tick with nothing to do waits up to "
                f"{ticks.get('wait_for_leads_s', 0):g} s for the inbox)",
                ["phase", "s", "ticks", "status", "past the wait p50/p95/max", "with runs: wall",
                 "lifecycle line after", "retired"], tick_rows)
    idle = figures.get("idle") or {}
    if idle:
        print(f"\n  quiet window {idle['window_s']:.0f} s: daemon + code server {fmt(idle['fleet_cores'])} cores, "
              f"webserver {fmt(idle['webserver_cores'])}, intake {fmt(idle['intake_cores'])}, sandbox "
              f"{fmt(idle['sandbox_cores'])}" + (f", Postgres server {fmt(idle['postgres_cores'])}"
                                                  if idle.get("postgres_cores") is not None else "")
              + f"; machine {fmt(idle['machine_cores_busy'])} cores busy")
        print("  by role (CPU s): " + ", ".join(f"{k} {v:.1f}" for k, v in idle["roles_cpu_s"].items() if v >= 0.05))
    fresh = figures.get("fresh") or {}
    if fresh:
        from bench.case import cell_text

        cells = fresh["first_request_s"]
        print(f"\n  fresh leads ({fresh['accepted']}/{fresh['sent']} accepted, to {fresh['source']}): 202 -> first request "
              f"p50 {cell_text(cells['p50'], 2)} / p95 {cell_text(cells['p95'], 2)} / max {cell_text(cells['max'], 2)} s")
    case = figures.get("case") or {}
    if case:
        print(f"  case of {case['leads']:,} leads x {case['sources']} sources: last 202 "
              f"{case['last_202_after_first_send_s']:.1f} s after the first send; all {case['wanted']:,} collections "
              f"queued {_secs(case['queued_after_first_send_s'], not case['all_queued'], 1)}, every lead a partition "
              f"{_secs(case['partitions_after_first_send_s'], not case['all_partitions'], 1)} after it")
    print_table(f"bench.scale: {cfg['leads']:,} leads ({cfg['active']:,} active), {cfg['sources']} sources, "
                f"{cfg['storage']}", ["", "measured", "goal", ""], goal_rows(figures))
    print(f"\n  The history ({(figures.get('history') or {}).get('written', 0):,} materializations) was written with "
          "Dagster's report_runless_asset_event, not collected: collecting it for real would take hours.")
    print("  `>x`: not reached by the time the bench stopped waiting, x is a lower bound.")


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leads", type=int, default=DEFAULT_LEADS,
                        help=f"domain leads registered in all (default {DEFAULT_LEADS:,}); all but --active in case "
                             f"`{ARCHIVE_CASE}`, closed")
    parser.add_argument("--active", type=int, default=DEFAULT_ACTIVE,
                        help=f"leads in open cases (default {DEFAULT_ACTIVE:,}, split over {ACTIVE_CASES} cases)")
    parser.add_argument("--history", type=int, default=DEFAULT_HISTORY,
                        help=f"materializations written over the active leads' partitions (default {DEFAULT_HISTORY:,})")
    parser.add_argument("--sources", type=int, default=DEFAULT_SOURCES,
                        help=f"copies of the sandbox's `{TEMPLATE_SOURCE}` source (default {DEFAULT_SOURCES})")
    parser.add_argument("--queries", type=int, default=DEFAULT_QUERIES,
                        help=f"rounds of the UI's GraphQL per view (default {DEFAULT_QUERIES})")
    parser.add_argument("--browser-loads", type=int, default=DEFAULT_BROWSER_LOADS,
                        help=f"loads of each page in headless Chromium (default {DEFAULT_BROWSER_LOADS}; 0: none)")
    parser.add_argument("--quiet-s", type=float, default=DEFAULT_QUIET_S,
                        help=f"the quiet window for idle CPU, s (default {DEFAULT_QUIET_S:g})")
    parser.add_argument("--fresh", type=int, default=DEFAULT_FRESH,
                        help=f"fresh single-lead webhooks (default {DEFAULT_FRESH})")
    parser.add_argument("--fresh-gap-s", type=float, default=DEFAULT_FRESH_GAP_S,
                        help=f"seconds between fresh webhooks (default {DEFAULT_FRESH_GAP_S:g})")
    parser.add_argument("--case-leads", type=int, default=DEFAULT_CASE_LEADS,
                        help=f"leads of the case sent in deliveries of {DELIVERY_LEADS:,} (default {DEFAULT_CASE_LEADS:,})")
    parser.add_argument("--sync-timeout-s", type=float, default=DEFAULT_SYNC_TIMEOUT_S,
                        help=f"give up waiting for the partitions this long after the daemon started "
                             f"(default {DEFAULT_SYNC_TIMEOUT_S:g})")
    parser.add_argument("--retire-timeout-s", type=float, default=DEFAULT_RETIRE_TIMEOUT_S,
                        help=f"wait at most this long for the closed case's leads to retire (default "
                             f"{DEFAULT_RETIRE_TIMEOUT_S:g}; 0: do not wait)")
    parser.add_argument("--case-timeout-s", type=float, default=DEFAULT_CASE_TIMEOUT_S,
                        help=f"give up waiting for the case's collections this long after its first send "
                             f"(default {DEFAULT_CASE_TIMEOUT_S:g})")
    parser.add_argument("--postgres", action="store_true",
                        help="the state store and Dagster's storage on Postgres (fresh databases on "
                             "INVESTIGATIONS_BENCH_POSTGRES_URL's server, else the test URL's, dropped after)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dirs (logs, stores) after the run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help="where the JSON goes (default bench/results)")
    args = parser.parse_args(argv)
    if not 0 < args.active <= args.leads:
        parser.error("--active must be at least 1 and at most --leads")
    if args.sources < 1 or args.queries < 1 or args.fresh < 1 or args.case_leads < 1:
        parser.error("--sources, --queries, --fresh and --case-leads must be at least 1")
    if args.history < 0 or args.browser_loads < 0 or args.quiet_s <= 0 or args.fresh_gap_s < 0:
        parser.error("--history and --browser-loads must be 0 or more, --quiet-s above 0, --fresh-gap-s 0 or more")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the bench through its `finally` blocks, so no fleet process outlives it.
    signal.signal(signal.SIGTERM, _interrupt)
    config = {"leads": args.leads, "active": args.active, "archive": args.leads - args.active,
              "history": args.history, "sources": args.sources, "queries": args.queries,
              "browser_loads": args.browser_loads, "quiet_s": args.quiet_s, "fresh": args.fresh,
              "fresh_gap_s": args.fresh_gap_s, "case_leads": args.case_leads, "case_priority": CASE_PRIORITY,
              "storage": "Postgres" if args.postgres else "SQLite",
              "goals": {"query_p95_s": GOAL_QUERY_P95_S, "idle_cores": GOAL_IDLE_CORES,
                        "fresh_first_request_p95_s": GOAL_FRESH_P95_S, "case_queued_s": GOAL_CASE_QUEUED_S}}
    started = time.time()
    figures: dict[str, Any] = {"bench": NAME, "config": config, "engine_version": engine_digest(),
                               "host": {"before": host_load()}}
    with fresh_databases("scale", wanted=args.postgres) as databases, \
            bench_workdir("bench-scale-", keep=args.keep) as workdir:
        figures.update(measure(args, workdir, databases))
    figures["host"]["after"] = host_load()
    figures["wall_s"] = time.time() - started
    figures["goals"] = {row[0]: {"measured": row[1], "goal": row[2], "verdict": row[3]} for row in goal_rows(figures)}
    report(figures)
    print(f"\n  bench wall time {figures['wall_s'] / 60:.1f} min")
    for error in figures["errors"]:
        print(f"  error: {error}", file=sys.stderr)
    path = write_results(NAME, figures, args.results_dir)
    print(f"\nfigures: {path}")
    return 1 if figures["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
