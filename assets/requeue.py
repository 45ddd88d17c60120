"""Dead letters requeued from the UI: the `requeue_dead_letters` job, launched from the Launchpad
with the same filters as `investigations dlq requeue`. Idempotent: launched twice, it queues once."""

from dagster import Config, Failure, MetadataValue, OpExecutionContext, Output, job, op
from pydantic import Field

from investigations.collection.collect import DEAD_LETTER_REASONS
from investigations.intake.leads import LeadError, lead_id_of
from investigations.scheduling.priority import PriorityClass
from resources.fleet import FleetResource

REQUEUE_JOB = "requeue_dead_letters"


class RequeueConfig(Config):
    source: str | None = Field(default=None, description="only this source's dead letters")
    reason: str | None = Field(default=None, description=f"only this reason: {', '.join(DEAD_LETTER_REASONS)}")
    lead: str | None = Field(default=None, description="only this lead: its id, or kind:value (domain:example.com)")
    priority: str = Field(default=PriorityClass.RECURRING.value, description="interactive, recurring or backfill")
    everything: bool = Field(default=False, description="requeue every dead letter (when no filter is given)")


def _lead_id(lead: str) -> str:
    try:
        return lead_id_of(lead)
    except LeadError as exc:
        raise Failure(description=f"lead {lead!r}: {exc}") from None


def validate(config: RequeueConfig, sources: list[str]) -> list[str]:
    """Every problem with the filters, each naming the valid choices."""
    problems = []
    if config.source is not None and config.source not in sources:
        problems.append(f"unknown source {config.source!r} (known: {', '.join(sources)})")
    if config.reason is not None and config.reason not in DEAD_LETTER_REASONS:
        problems.append(f"unknown reason {config.reason!r} (known: {', '.join(DEAD_LETTER_REASONS)})")
    if config.priority not in {p.value for p in PriorityClass}:
        problems.append(f"unknown priority {config.priority!r} (known: {', '.join(p.value for p in PriorityClass)})")
    if not (config.everything or config.source or config.reason or config.lead):
        problems.append("say which dead letters to requeue (source, reason, lead) or set everything: true")
    return problems


@op(description="Queue the matching dead letters for another collection (idempotent).")
def requeue_matching_dead_letters(context: OpExecutionContext, config: RequeueConfig, fleet: FleetResource) -> Output:
    problems = validate(config, [spec.name for spec in fleet.catalog.sources])
    if problems:
        raise Failure(description="; ".join(problems), allow_retries=False)
    lead_id = _lead_id(config.lead) if config.lead else None
    store = fleet.store
    queued = store.requeue_dead_letters(source=config.source, reason_group=config.reason, lead_id=lead_id,
                                        priority_class=config.priority)
    matching = len(store.dead_letters(source=config.source, reason_group=config.reason, lead_id=lead_id))
    context.log.info(f"requeued {len(queued)} of {matching} matching dead letter(s)")
    return Output(None, metadata={
        "requeued": len(queued), "matching": matching, "already_queued": matching - len(queued),
        "leads": MetadataValue.json([f"{letter.source}/{letter.lead_id} ({letter.reason_group})" for letter in queued]),
    })


@job(name=REQUEUE_JOB, description="Requeue dead letters (the same filters as `investigations dlq requeue`).")
def requeue_dead_letters_job() -> None:
    requeue_matching_dead_letters()
