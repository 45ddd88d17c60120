"""The UI's partition status, kept warm: rebuilt in the background when the `leads` keys change.

Dagster caches each partitioned asset's status (its materialized, failed and in-progress
partitions) in its storage, under an identifier made from every partition key. Any key added or
removed (a new lead, a retired one) makes every source's cached status stale, and the next UI view
that reads it (the catalog, an asset's page) rebuilds it from the event log while the operator
waits: seconds at 100,000 active leads. This sensor does that rebuild instead, a few seconds after
the keys changed, with Dagster's own function (`resources.dagster_internals.warm_partition_status`),
so the UI finds the status current and only adds the events since. Its cursor is the identifier it
last warmed for; a tick whose keys are unchanged reads them and skips.
"""

from __future__ import annotations

from dagster import DefaultSensorStatus, SensorDefinition, SensorEvaluationContext, SensorResult, SkipReason, sensor

from assets.naming import source_asset_key
from assets.partitions import leads_partitions
from investigations.sources.specs import SourceCatalog
from resources.dagster_internals import warm_partition_status

WARM_PARTITION_STATUS_SENSOR = "warm_partition_status"
# How often the keys are compared with the ones last warmed for (a read of every key: about 0.2 s
# at 100,000 on SQLite).
WARM_EVERY_S = 15


def build_partition_status_sensor(catalog: SourceCatalog) -> SensorDefinition:
    keys = [source_asset_key(spec.name) for spec in catalog.sources]

    @sensor(name=WARM_PARTITION_STATUS_SENSOR, minimum_interval_seconds=WARM_EVERY_S,
            default_status=DefaultSensorStatus.RUNNING,
            description="Rebuilds each source's partition status (what the catalog and an asset's page show) "
                        "soon after the leads partitions change, so the UI does not rebuild it while you wait.")
    def warm(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        definition_id = leads_partitions.get_serializable_unique_identifier(dynamic_partitions_store=context.instance)
        if context.cursor == definition_id:
            return SkipReason("the leads partitions are unchanged since the last warm-up")
        rebuilt = warm_partition_status(context.instance, keys, leads_partitions, definition_id)
        return SensorResult(skip_reason=f"partition status rebuilt for {len(rebuilt)} source(s) of {len(keys)}",
                            cursor=definition_id)

    return warm
