"""Each lead's visits: each (source, lead)'s change history (its last answer with records and its
last visits, changed or not) and the rate of change estimated from it, written with its collection;
the monitored leads the recurring planner weighs, and each source's last plan (`cadence_plans`)
with one lead as its next visit is worked out from (`investigations.scheduling.cadence` decides
what a visit says, how fast a lead changes and what is due; this module keeps and reads)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Row, Select, String, and_, bindparam, exists, func, select, update

from investigations.scheduling.cadence import (
    ChangeHistory,
    MonitoredLead,
    SourcePlan,
    Visit,
    change_rate,
    observe,
    says_something,
)
from investigations.store import schema as s
from investigations.store.sql import Tables, upsert


def record_visit(conn: Connection, *, source: str, lead_id: str, outcome: str, records: int,
                 content_hash: str | None, now: datetime, prior_s: float | None = None) -> None:
    """Within a collection's transaction: a collection that found records is a visit of its lead
    (`cadence.observe`), and its rate is estimated again for the source's prior of `prior_s` seconds
    (None: left to the planner); any other collection says nothing and leaves the history alone."""
    if not says_something(outcome, records) or not content_hash:
        return
    t = s.lead_visits
    row = conn.execute(
        select(t.c.seen_at, t.c.seen_hash, t.c.visits).where(t.c.source == source, t.c.lead_id == lead_id)
        .with_for_update()
    ).first()
    before = ChangeHistory(row.seen_at.timestamp(), row.seen_hash, decode_visits(row.visits)) if row else None
    after = observe(before, at_s=now.timestamp(), content_hash=content_hash)
    if after is before:
        return
    rate = change_rate(after.visits, 1 / prior_s) if prior_s else None
    upsert(conn, t, [{"source": source, "lead_id": lead_id, "seen_at": datetime.fromtimestamp(after.seen_at_s, UTC),
                      "seen_hash": after.seen_hash, "visits": encode_visits(after.visits), "rate_per_s": rate,
                      "prior_s": prior_s if rate is not None else None}],
           keys=["source", "lead_id"], update=["seen_at", "seen_hash", "visits", "rate_per_s", "prior_s"])


def encode_visits(visits: Sequence[Visit]) -> str:
    """`<seconds>:<1|0>` per visit, comma separated (seconds to the millisecond)."""
    return ",".join(f"{round(interval_s, 3)!r}:{int(changed)}" for interval_s, changed in visits)


def decode_visits(text: str) -> tuple[Visit, ...]:
    """The visits `encode_visits` wrote."""
    if not text:
        return ()
    pairs = (item.rpartition(":") for item in text.split(","))
    return tuple((float(interval), flag == "1") for interval, _, flag in pairs)


@dataclass(frozen=True)
class PlannedLead:
    """One lead a source collected, as its next visit is worked out from: the lead as the planner
    reads it (`MonitoredLead`: its last collection, its rate kept for the source's prior or else its
    visits, whether an open case holds it), whether any case holds it, whether it is a dead letter
    there, its latest collection's outcome and records, and the source's last plan (None: not
    planned yet)."""

    lead: MonitoredLead
    in_case: bool
    dead_letter: bool
    outcome: str
    records: int
    plan: SourcePlan | None


class VisitTables(Tables):
    """Change histories per (source, lead), and the leads a source's recurring plan weighs."""

    def change_history(self, source: str, lead_id: str) -> ChangeHistory | None:
        t = s.lead_visits
        with self.reading() as conn:
            row = conn.execute(select(t.c.seen_at, t.c.seen_hash, t.c.visits)
                               .where(t.c.source == source, t.c.lead_id == lead_id)).first()
        return ChangeHistory(row.seen_at.timestamp(), row.seen_hash, decode_visits(row.visits)) if row else None

    def cadence_leads(self, source: str, *, lead_kinds: Sequence[str], prior_s: float, closed_too: bool = False
                      ) -> list[MonitoredLead]:
        """Every lead `source` monitors, by lead id: of a kind it takes, collected by it before, not
        dead-lettered there (a human decides about those), in an open case (`closed_too`: in any
        case), with when it was last collected (its last success, else its last attempt) and its
        rate kept for a prior of `prior_s` seconds (else its visits, to estimate it from). Those
        waiting or running for it are included, marked: they spend its budget too."""
        c, q, dl, lc = s.collections, s.collection_queue, s.dead_letters, s.lead_visits
        active = (
            select(s.case_leads.c.lead_id)
            .join(s.cases, s.cases.c.case_id == s.case_leads.c.case_id)
            .where(s.cases.c.status == "active")
        )
        held = select(s.case_leads.c.lead_id) if closed_too else active
        pending = select(q.c.lead_id).where(q.c.source == source, q.c.state != "done")
        dead = select(dl.c.lead_id).where(dl.c.source == source)
        query = (
            select(c.c.lead_id, func.coalesce(c.c.last_success_at, c.c.last_attempt_at).label("last_at"),
                   c.c.lead_id.in_(active).label("open"), c.c.lead_id.in_(pending).label("waiting"),
                   lc.c.visits, lc.c.rate_per_s, lc.c.prior_s)
            .select_from(c.join(s.leads, s.leads.c.lead_id == c.c.lead_id)
                         .outerjoin(lc, and_(lc.c.source == c.c.source, lc.c.lead_id == c.c.lead_id)))
            .where(c.c.source == source, s.leads.c.kind.in_(list(lead_kinds)), c.c.lead_id.in_(held),
                   c.c.lead_id.not_in(dead))
            .order_by(c.c.lead_id)
        )
        with self.reading() as conn:
            return [_monitored(row, prior_s, waiting=bool(row.waiting)) for row in conn.execute(query)]

    def planned_lead(self, source: str, lead_id: str, *, prior_s: float) -> PlannedLead | None:
        """One lead `source` collected, with its source's last plan, in one indexed query (a batch
        run asks for each lead it stores): None when the source never collected it. Its rate is the
        one kept for a prior of `prior_s` seconds, else its visits, to estimate it from."""
        with self.reading() as conn:
            row = conn.execute(_planned_lead_query(), {"source": source, "lead_id": lead_id}).first()
        if row is None:
            return None
        plan = None if row.planned_at is None else stored_plan(row)
        return PlannedLead(_monitored(row, prior_s), in_case=bool(row.in_case), dead_letter=bool(row.dead),
                           outcome=row.outcome, records=row.records, plan=plan)

    def keep_cadence_plan(self, source: str, plan: SourcePlan, *, now: datetime) -> None:
        """Keep what the source's recurring plan decided now, for its leads' next visits to read."""
        row = {"source": source, "scale": None if plan.scale == math.inf else plan.scale, "short": plan.short,
               "planned_at": now}
        with self.engine.begin() as conn:
            upsert(conn, s.cadence_plans, [row], keys=["source"], update=["scale", "short", "planned_at"])

    def cadence_plan(self, source: str) -> SourcePlan | None:
        """The source's last recurring plan (None: not planned yet)."""
        t = s.cadence_plans
        with self.reading() as conn:
            row = conn.execute(select(t.c.scale, t.c.short).where(t.c.source == source)).first()
        return None if row is None else stored_plan(row)

    def keep_change_rates(self, source: str, rates: Mapping[str, float], *, prior_s: float) -> None:
        """Keep rates the planner estimated for a prior of `prior_s` seconds (its source's prior
        changed since they were kept), so the next pass reads them."""
        if not rates:
            return
        t = s.lead_visits
        statement = (update(t).where(t.c.source == source, t.c.lead_id == bindparam("lead"))
                     .values(rate_per_s=bindparam("rate"), prior_s=prior_s))
        with self.engine.begin() as conn:
            conn.execute(statement, [{"lead": lead_id, "rate": rate} for lead_id, rate in rates.items()])


def stored_plan(row: Any) -> SourcePlan:
    """A source's plan from a row with its `cadence_plans` columns (`scale` None: inf, every lead at max)."""
    return SourcePlan(math.inf if row.scale is None else row.scale, bool(row.short))


def _monitored(row: Row[Any], prior_s: float, *, waiting: bool = False) -> MonitoredLead:
    """A monitored lead from its row: its kept rate when kept for this prior, else its visits."""
    kept = row.rate_per_s if row.rate_per_s is not None and row.prior_s == prior_s else None
    return MonitoredLead(row.lead_id, row.last_at.timestamp(),
                         visits=() if kept is not None else decode_visits(row.visits or ""),
                         rate_per_s=kept, open_case=bool(row.open), waiting=waiting)


@cache
def _planned_lead_query() -> Select[Any]:
    """`VisitTables.planned_lead`'s query, built once with `source` and `lead_id` bound at each call:
    a batch run asks it of every lead it stores, and building and keying the statement each time
    cost more than running it."""
    c, lc, cp, dl, cl = s.collections, s.lead_visits, s.cadence_plans, s.dead_letters, s.case_leads
    source, lead_id = bindparam("source", type_=String), bindparam("lead_id", type_=String)
    open_case = exists().where(cl.c.lead_id == lead_id, s.cases.c.case_id == cl.c.case_id,
                               s.cases.c.status == "active")
    return (
        select(c.c.lead_id, func.coalesce(c.c.last_success_at, c.c.last_attempt_at).label("last_at"),
               c.c.outcome, c.c.records, open_case.label("open"),
               exists().where(cl.c.lead_id == lead_id).label("in_case"),
               exists().where(dl.c.source == source, dl.c.lead_id == lead_id).label("dead"),
               lc.c.visits, lc.c.rate_per_s, lc.c.prior_s, cp.c.scale, cp.c.short, cp.c.planned_at)
        .select_from(c.outerjoin(lc, and_(lc.c.source == c.c.source, lc.c.lead_id == c.c.lead_id))
                     .outerjoin(cp, cp.c.source == c.c.source))
        .where(c.c.source == source, c.c.lead_id == lead_id)
    )
