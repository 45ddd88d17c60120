"""The new-lead sensor: inbox rows become dynamic partitions and one run per (source, lead)."""

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.jobs import SourceJob
from assets.naming import job_name
from assets.partitions import leads_partitions
from investigations.priority import DAGSTER_PRIORITY, PRIORITY_CLASS_TAG, PriorityClass
from investigations.specs import SourceCatalog
from investigations.store import InboxItem
from resources.fleet import FleetResource
from sensors.pools import sync_pool_limits

NEW_LEAD_SENSOR = "new_leads"
# Caps one tick's work: Dagster creates ~10 runs/s from one tick, and a tick has 60 s to finish.
MAX_INBOX_ROWS_PER_TICK = 100
INTERVAL_S = 5


def run_requests_for(item: InboxItem, catalog: SourceCatalog) -> tuple[list[RunRequest], list[str]]:
    """The runs one inbox row asks for, and the reasons for any wanted source that is skipped.

    The run key names the inbox row, so re-evaluating the same rows (a reset cursor, a retried tick)
    never launches a second run, while the same lead in a later webhook is collected again.
    """
    wanted = item.sources or [spec.name for spec in catalog.for_kind(item.lead.kind)]
    priority = PriorityClass(item.priority_class)
    requests, skipped = [], []
    for name in wanted:
        if name not in catalog.names:
            skipped.append(f"{name}: no longer in sources.yaml")
            continue
        if not catalog.get(name).accepts(item.lead.kind):
            skipped.append(f"{name}: does not take {item.lead.kind} leads")
            continue
        requests.append(
            RunRequest(
                job_name=job_name(name),
                partition_key=item.lead.id,
                run_key=f"{name}:{item.lead.id}:inbox-{item.id}",
                tags={
                    "dagster/priority": str(DAGSTER_PRIORITY[priority]),
                    PRIORITY_CLASS_TAG: priority.value,
                    "investigations/source": name,
                    "investigations/lead_id": item.lead.id,
                    "investigations/case_id": item.case_id,
                },
            )
        )
    return requests, skipped


def build_new_lead_sensor(catalog: SourceCatalog, jobs: list[SourceJob]) -> SensorDefinition:
    @sensor(
        name=NEW_LEAD_SENSOR,
        jobs=jobs,
        minimum_interval_seconds=INTERVAL_S,
        default_status=DefaultSensorStatus.RUNNING,
        description="Turns leads accepted by the webhook intake into `leads` partitions and interactive "
        "runs, one per wanted source. The cursor is the last inbox row handled.",
    )
    def new_leads(context: SensorEvaluationContext, fleet: FleetResource) -> SensorResult | SkipReason:
        cursor = int(context.cursor or 0)
        items = fleet.store.inbox_after(cursor, limit=MAX_INBOX_ROWS_PER_TICK)
        if not items:
            return SkipReason(f"no new leads in the inbox after row {cursor}")
        sync_pool_limits(context.instance, catalog)
        run_requests: list[RunRequest] = []
        for item in items:
            requests, skipped = run_requests_for(item, catalog)
            run_requests.extend(requests)
            for reason in skipped:
                context.log.warning(f"inbox row {item.id} lead {item.lead.id}: skipped {reason}")
        partition_keys = sorted({item.lead.id for item in items})
        context.log.info(f"{len(items)} inbox row(s) -> {len(partition_keys)} lead(s), {len(run_requests)} run(s)")
        return SensorResult(
            run_requests=run_requests,
            dynamic_partitions_requests=[leads_partitions.build_add_request(partition_keys)],
            cursor=str(items[-1].id),
        )

    return new_leads
