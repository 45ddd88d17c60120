"""Silent degradation: the judgements that keep a source that is "up" but quietly returning less
from being trusted.

Each function takes plain values (counts, record numbers, field lists, timestamps) and returns a
`Verdict`: passed or not, how serious (`error`: the data is broken; `warn`: it drifted), the
observed value, the threshold it was held to and examples. The Dagster layer turns verdicts into
asset check results; nothing here imports Dagster, and every rule is table-tested.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from investigations.scheduling.cadence import plan_source
from investigations.store import SourceIncident

if TYPE_CHECKING:
    from investigations.sources.specs import SourceSpec
    from investigations.store import StateStore

Severity = Literal["error", "warn"]

# A baseline needs this many earlier collections before it judges anything.
MIN_BASELINE = 5
# A collection is short when it found less than this share of the source's recent median.
SHORT_SHARE = 0.25
# How many earlier collections make a source's baseline (records, fields), newest first.
BASELINE_COLLECTIONS = 50
# A field counts as one the source always had when this many of its recent answers carried it in
# every record (and none lacked it).
ALWAYS_FIELD_MIN = 5
# Block rate: a window needs this many requests to be judged; it spikes when its block share is at
# least SPIKE_FLOOR and SPIKE_FACTOR times the baseline's; at BLOCKED_ERROR the source is unusable.
MIN_REQUESTS = 20
SPIKE_FLOOR = 0.2
SPIKE_FACTOR = 2.0
BLOCKED_ERROR = 0.8
# Volume: records per answered collection, or the size of usable answers, below this share of the
# baseline's is a drop (with at least MIN_COLLECTIONS answered collections on both sides).
DROP_SHARE = 0.5
MIN_COLLECTIONS = 5
# Freshness: below this share of monitored leads collected with records within their cadence the
# check warns; below FRESH_ERROR_SHARE it fails as an error.
FRESH_SHARE = 0.9
FRESH_ERROR_SHARE = 0.5
# On a learned cadence a lead is fresh while its last collection with records is at most its own
# planned interval old plus this share of it, and at least plus one planning window (`recrawl.min`).
# Why half: the plan is made again every minute, and every lead's interval moves at once when the
# budget is split again (rates estimated again, leads joining or leaving cases); a lead collected on
# time under the last plan must not turn stale while the source works through what became due, so a
# plan may shorten intervals by a third (1 / 1.5) before the check notices. Why the window: a due lead
# is late by about as much whatever its interval (queued at the next tick, started at a jittered moment
# within a tenth of a window, handed over in batches), which half a short interval would not cover.
FRESH_GRACE_SHARE = 0.5
EXAMPLES = 5
# The windows a source is judged over: refusals in the last REFUSALS_RECENT_S against the day
# before; volume in the last VOLUME_RECENT_S against the week before.
REFUSALS_RECENT_S = 15 * 60
REFUSALS_BASELINE_S = 24 * 3600
VOLUME_RECENT_S = 3600
VOLUME_BASELINE_S = 7 * 86400
# Outcomes of a request that mean the source refused us rather than answered.
REFUSED = ("blocked", "throttled")


@dataclass(frozen=True)
class Verdict:
    passed: bool
    severity: Severity
    observed: float | int | None
    threshold: float | int | None
    description: str
    examples: list[str] = field(default_factory=list)
    details: dict[str, float | int | str | None] = field(default_factory=dict)
    # False when there is nothing to judge yet (no canary collected, no lead monitored): the check is
    # not reported at all, so it never reads Passed on no evidence (nor Failed, which would alert).
    judged: bool = True


def answer_verdict(
    *,
    records: int,
    expected_min: int,
    baseline: Sequence[int],
    fields: Sequence[str],
    baseline_fields: Sequence[Sequence[str] | None],
) -> Verdict:
    """One collection's answer: ERROR under the source's fixed minimum, WARN when short of the
    source's own recent median for the lead's kind, or missing fields its answers always had."""
    median = statistics.median(baseline) if len(baseline) >= MIN_BASELINE else None
    details: dict[str, float | int | str | None] = {
        "records": records, "expected_min_records": expected_min,
        "baseline_median": median, "baseline_collections": len(baseline),
    }
    if records < expected_min:
        return Verdict(False, "error", records, expected_min,
                       f"answered with {records} record(s); at least {expected_min} expected. "
                       "The source may be silently empty or blocking.", details=details)
    if median is not None and median > 0 and records < SHORT_SHARE * median:
        threshold = SHORT_SHARE * median
        return Verdict(False, "warn", records, threshold,
                       f"answered with {records} record(s), under {SHORT_SHARE:.0%} of its recent median "
                       f"({median:g}) for this kind of lead.", details=details)
    missing = missing_fields(fields, baseline_fields) if records else []
    if missing:
        details["missing_fields"] = ", ".join(missing)
        return Verdict(False, "warn", len(missing), 0,
                       f"records lack field(s) its answers always had: {', '.join(missing)}.",
                       examples=missing[:EXAMPLES], details=details)
    return Verdict(True, "error", records, expected_min, "the answer looks like the source's usual answers",
                   details=details)


def missing_fields(fields: Sequence[str], baseline_fields: Sequence[Sequence[str] | None]) -> list[str]:
    """Fields every known earlier answer carried in every record (at least ALWAYS_FIELD_MIN of
    them) that this answer's records do not all carry."""
    known = [set(f) for f in baseline_fields if f is not None]
    if len(known) < ALWAYS_FIELD_MIN:
        return []
    always = set.intersection(*known)
    return sorted(always - set(fields))


def block_rate_verdict(recent: dict[str, int], baseline: dict[str, int]) -> Verdict:
    """The share of requests refused (blocked or throttled) in the recent window against the
    baseline window's: a spike warns, a source refusing nearly everything is an error."""
    total = sum(recent.values())
    rate = sum(recent.get(o, 0) for o in REFUSED) / total if total else 0.0
    base_total = sum(baseline.values())
    base_rate = sum(baseline.get(o, 0) for o in REFUSED) / base_total if base_total else 0.0
    threshold = max(SPIKE_FLOOR, SPIKE_FACTOR * base_rate)
    details: dict[str, float | int | str | None] = {
        "requests": total, "refused_share": round(rate, 4), "baseline_requests": base_total,
        "baseline_refused_share": round(base_rate, 4)}
    if total < MIN_REQUESTS:
        return Verdict(True, "warn", rate, threshold, f"too few requests to judge ({total} < {MIN_REQUESTS})",
                       details=details)
    if rate >= BLOCKED_ERROR:
        return Verdict(False, "error", rate, BLOCKED_ERROR,
                       f"{rate:.0%} of {total} recent requests refused: the source is blocking the fleet.",
                       details=details)
    if rate >= threshold:
        return Verdict(False, "warn", rate, threshold,
                       f"{rate:.0%} of {total} recent requests refused, against {base_rate:.0%} before.",
                       details=details)
    return Verdict(True, "warn", rate, threshold, f"{rate:.0%} of {total} recent requests refused", details=details)


@dataclass(frozen=True)
class Volume:
    """A window of a source's work: answered collections, empty ones, records stored, and the mean
    size of its usable answers."""

    collections: int
    empty: int
    records: int
    ok_bytes: float | None


def volume_verdict(recent: Volume, baseline: Volume) -> Verdict:
    """Records per answered collection, and the size of usable answers, against the baseline:
    a source whose answers shrink (an empty template, a truncated list) warns."""
    details: dict[str, float | int | str | None] = {
        "collections": recent.collections, "empty_collections": recent.empty,
        "baseline_collections": baseline.collections, "answer_bytes": recent.ok_bytes,
        "baseline_answer_bytes": baseline.ok_bytes}
    if recent.collections < MIN_COLLECTIONS or baseline.collections < MIN_COLLECTIONS:
        return Verdict(True, "warn", None, None, "too few collections to judge", details=details)
    per = recent.records / recent.collections
    base_per = baseline.records / baseline.collections
    details |= {"records_per_collection": round(per, 3), "baseline_records_per_collection": round(base_per, 3)}
    if base_per > 0 and per < DROP_SHARE * base_per:
        return Verdict(False, "warn", round(per, 3), round(DROP_SHARE * base_per, 3),
                       f"{per:.2f} records per collection recently, against {base_per:.2f} before.", details=details)
    if recent.ok_bytes is not None and baseline.ok_bytes and recent.ok_bytes < DROP_SHARE * baseline.ok_bytes:
        return Verdict(False, "warn", round(recent.ok_bytes), round(DROP_SHARE * baseline.ok_bytes),
                       f"answers of {recent.ok_bytes:.0f} bytes on average recently, against "
                       f"{baseline.ok_bytes:.0f} before.", details=details)
    return Verdict(True, "warn", round(per, 3), round(DROP_SHARE * base_per, 3),
                   f"{per:.2f} records per collection (baseline {base_per:.2f})", details=details)


def stale_after_s(interval_s: float, *, window_s: float) -> float:
    """How old a learned-cadence lead's last collection with records may be before it is stale: its
    own planned interval plus FRESH_GRACE_SHARE of it, at least plus one window (see the constant)."""
    return interval_s + max(FRESH_GRACE_SHARE * interval_s, window_s)


def freshness_verdict(monitored: Sequence[tuple[str, datetime | None]], *, cadence_s: float, now: datetime,
                      intervals_s: Mapping[str, float] | None = None, window_s: float = 0.0) -> Verdict:
    """The share of monitored leads collected WITH records within their cadence (an empty answer
    is not fresh) and the age of the stalest one.

    On a fixed cadence (`intervals_s` None) every lead is held to `cadence_s`, the source's
    `recrawl_every`. On a learned one each lead is held to its own planned interval (`intervals_s`)
    plus its grace (`stale_after_s`, with the source's `recrawl.min` as `window_s`), and a lead the
    plan leaves out (a dead letter there) to `cadence_s`, the source's `recrawl.max`. Stale leads are
    listed most overdue first. The description and `rule` say which rule judged."""
    def allowed_s(lead_id: str) -> float:
        interval = None if intervals_s is None else intervals_s.get(lead_id)
        return cadence_s if interval is None else stale_after_s(interval, window_s=window_s)

    stale: list[tuple[float, float, str]] = []  # (past its allowance, age, lead)
    for lead_id, at in monitored:
        age = math.inf if at is None else (now - at).total_seconds()
        if age > (allowed := allowed_s(lead_id)):
            stale.append((age - allowed, age, lead_id))
    total = len(monitored)
    share = 1.0 - len(stale) / total if total else 1.0
    stale.sort(reverse=True)
    oldest = max((age for _, age, _ in stale if age != math.inf), default=None)
    details: dict[str, float | int | str | None] = {
        "monitored_leads": total, "stale_leads": len(stale), "fresh_share": round(share, 4),
        **_freshness_rule(cadence_s, intervals_s, window_s),
        "stalest_age_s": None if oldest is None else round(oldest),
        "never_collected_with_records": sum(1 for _, age, _ in stale if age == math.inf)}
    examples = [lead for _, _, lead in stale[:EXAMPLES]]
    if total == 0:
        return Verdict(True, "warn", share, FRESH_SHARE, "no monitored leads", details=details, judged=False)
    within = (f"within {cadence_s:g} s (fixed cadence: recrawl_every)" if intervals_s is None else
              f"within their own planned interval plus half of it, at least plus {window_s:g} s (learned cadence: "
              f"recrawl.min)")
    text = f"{total - len(stale)} of {total} monitored leads collected with records {within}"
    if share < FRESH_ERROR_SHARE:
        return Verdict(False, "error", share, FRESH_ERROR_SHARE, text, examples, details)
    if share < FRESH_SHARE:
        return Verdict(False, "warn", share, FRESH_SHARE, text, examples, details)
    return Verdict(True, "warn", share, FRESH_SHARE, text, examples, details)


def _freshness_rule(cadence_s: float, intervals_s: Mapping[str, float] | None,
                    window_s: float) -> dict[str, float | int | str | None]:
    """Which rule judged freshness, as check metadata: a fixed cadence's one age for every lead, or
    each lead's own planned interval with its grace (and the median interval planned)."""
    if intervals_s is None:
        return {"rule": "fixed cadence: every lead within recrawl_every", "cadence_s": cadence_s}
    planned = [interval for interval in intervals_s.values() if interval != math.inf]
    return {"rule": f"learned cadence: each lead within its own planned interval x {1 + FRESH_GRACE_SHARE:g}, "
                    "at least + recrawl.min; a lead the plan leaves out within recrawl.max",
            "grace_share": FRESH_GRACE_SHARE, "window_s": window_s, "max_s": cadence_s,
            "median_interval_s": round(statistics.median(planned)) if planned else None}


@dataclass(frozen=True)
class CanaryState:
    """A canary lead's latest collection by its source: its outcome (None: not collected yet),
    the records it stored, whether it is a dead letter, and when it last changed (`at`: the latest
    of its last attempt and its dead letter's last failure; None: never)."""

    lead: str
    outcome: str | None
    records: int
    dead_letter: bool = False
    at: datetime | None = None


def canary_needs(expected_min: int) -> int:
    """Records a canary's answer must hold to pass: the source's minimum, and at least one."""
    return max(1, expected_min)


def canary_answer_fails(canary: CanaryState, *, expected_min: int) -> bool:
    """Its latest answer itself failed: fewer records than it needs, or a failure (a dead letter
    alone, a run that died on it, is not an answer)."""
    return canary.outcome is not None and (canary.outcome == "failed" or canary.records < canary_needs(expected_min))


def canary_fails(canary: CanaryState, *, expected_min: int) -> bool:
    """The canary fails its source: its answer failed, or it is a dead letter. One not collected
    yet does not (it is not judged)."""
    return canary.outcome is not None and (canary.dead_letter or canary_answer_fails(canary, expected_min=expected_min))


def canary_verdict(canaries: Sequence[CanaryState], *, expected_min: int) -> Verdict:
    """Known-positive leads must always yield records: one that answered with fewer than the
    source's minimum (at least one), failed or was dead-lettered fails the source (ERROR)."""
    need = canary_needs(expected_min)
    failing = [c for c in canaries if canary_fails(c, expected_min=expected_min)]
    waiting = [c for c in canaries if c.outcome is None and not c.dead_letter]
    details: dict[str, float | int | str | None] = {
        "canaries": len(canaries), "failing": len(failing), "not_collected_yet": len(waiting)}
    examples = [f"{c.lead}: {'dead letter' if c.dead_letter else c.outcome} ({c.records} records)" for c in failing]
    if not canaries:
        return Verdict(True, "error", 0, need, "no canary leads configured", details=details, judged=False)
    if waiting and not failing:
        return Verdict(True, "error", 0, 0, f"{len(waiting)} of {len(canaries)} canaries not collected yet: not "
                       "judged until they are", details=details, judged=False)
    if failing:
        return Verdict(False, "error", len(failing), 0,
                       f"{len(failing)} of {len(canaries)} canary lead(s) yielded fewer than {need} record(s).",
                       examples[:EXAMPLES], details)
    return Verdict(True, "error", 0, 0, f"{len(canaries) - len(waiting)} of {len(canaries)} canaries collected, "
                   "all with records", details=details)


def follow_canaries(incident: SourceIncident | None, canaries: Sequence[CanaryState], *, source: str,
                    expected_min: int) -> SourceIncident:
    """The source's canary record after what its canaries show now (`StateStore.source_incident`; the
    recurring planner applies this every pass, see `investigations.scheduling.dispatch.follow_incident`).

    - An incident starts at the first failing canary collection (`canary_fails`: no records, failed,
      or a dead letter) after one that passed; its window begins just after that pass (`since`, the
      latest canary collection seen passing), or, with none on record, at the failure itself. The
      answers of that gap were read from a source no longer known to work.
    - It ends at the canary collection after which none of the source's canaries fails (with several,
      the last to pass again); a canary not collected yet neither fails nor passes.
    - While no canary fails, `passed_at` follows the latest canary collection.
    - An incident that starts before the last one's leads were queued again takes over that one's
      window: those leads were never re-collected, so they stay owed.

    Times are the collections' own, not the pass's clock, so a pass that runs late changes nothing.
    """
    current = incident or SourceIncident(source)
    failing = [c.at for c in canaries if c.at is not None and canary_fails(c, expected_min=expected_min)]
    if failing:
        if current.open:
            return current
        since = current.window_start if current.awaiting_requeue else current.passed_at
        return replace(current, started_at=min(failing), since=since, ended_at=None, requeued_at=None)
    passing = [c.at for c in canaries if c.at is not None and c.outcome is not None]
    if not passing:
        return current
    latest = max(passing)
    followed = replace(current, passed_at=max(latest, current.passed_at or latest))
    return replace(followed, ended_at=latest) if current.open else followed


def budget_verdict(spent_usd: float, budget_usd: float) -> Verdict:
    """A source whose spend today reached its daily budget gets no background work (WARN): its
    recurring crawls and backfills wait for the next UTC day; interactive leads still run."""
    details: dict[str, float | int | str | None] = {"spent_today_usd": round(spent_usd, 4),
                                                     "daily_budget_usd": budget_usd}
    if budget_usd > 0 and spent_usd >= budget_usd:
        return Verdict(False, "warn", round(spent_usd, 4), budget_usd,
                       f"spent {spent_usd:.2f} of its {budget_usd:.2f} USD budget today: recurring and backfill "
                       "work waits for the next UTC day; interactive leads still run", details=details)
    return Verdict(True, "warn", round(spent_usd, 4), budget_usd,
                   f"spent {spent_usd:.2f} of {budget_usd:.2f} USD today", details=details)


def canary_states(store: StateStore, spec: SourceSpec) -> list[CanaryState]:
    """The source's canary leads as its latest collections and dead letters leave them."""
    states = []
    for canary in spec.canaries:
        lead_id = canary.lead.id
        done = store.collection(spec.name, lead_id)
        letters = store.dead_letters(source=spec.name, lead_id=lead_id)
        times = [done.last_attempt_at] if done else []
        times += [letter.last_seen for letter in letters]
        states.append(CanaryState(f"{canary.kind}:{canary.value}", done.outcome if done else None,
                                  done.records if done else 0, bool(letters), max(times, default=None)))
    return states


def lead_intervals_s(store: StateStore, spec: SourceSpec, *, now: datetime) -> dict[str, float] | None:
    """Each monitored lead's planned interval on a learned cadence, by lead id: the recurring plan
    over every lead the source monitors, made now from the store (`cadence.plan_source`; read only:
    the check depends on no planner having run). None on a fixed cadence: every lead alike."""
    if spec.recrawl.is_fixed:
        return None
    leads = store.cadence_leads(spec.name, lead_kinds=spec.lead_kinds, prior_s=spec.recrawl.prior_s,
                                closed_too=spec.recrawl.closed_weight > 0)
    return dict(plan_source(spec, leads, now_s=now.timestamp()).by_lead)


def judge_source(store: StateStore, spec: SourceSpec, *, now: datetime,
                 spent_today_usd: float | None = None) -> dict[str, Verdict]:
    """Every source-level judgement, from the state store: `fresh`, `canaries`, `refusals`, `volume`
    and, given the day's spend of a source with a budget, `budget`."""
    verdicts = {"fresh": freshness_verdict(store.monitored_freshness(spec.name, lead_kinds=spec.lead_kinds),
                                           cadence_s=spec.recrawl_every_s, now=now,
                                           intervals_s=lead_intervals_s(store, spec, now=now),
                                           window_s=spec.recrawl.min_s)}
    verdicts["canaries"] = canary_verdict(canary_states(store, spec), expected_min=spec.expected_min_records)
    recent_since = now - timedelta(seconds=REFUSALS_RECENT_S)
    recent, _ = store.fetch_profile(spec.name, since=recent_since)
    before, _ = store.fetch_profile(spec.name, since=recent_since - timedelta(seconds=REFUSALS_BASELINE_S),
                                    until=recent_since)
    verdicts["refusals"] = block_rate_verdict(recent, before)
    volume_since = now - timedelta(seconds=VOLUME_RECENT_S)
    volume_before = volume_since - timedelta(seconds=VOLUME_BASELINE_S)
    _, recent_bytes = store.fetch_profile(spec.name, since=volume_since)
    _, before_bytes = store.fetch_profile(spec.name, since=volume_before, until=volume_since)
    verdicts["volume"] = volume_verdict(
        Volume(*store.collection_volume(spec.name, since=volume_since), ok_bytes=recent_bytes),
        Volume(*store.collection_volume(spec.name, since=volume_before, until=volume_since), ok_bytes=before_bytes))
    if spent_today_usd is not None and spec.daily_budget_usd > 0:
        verdicts["budget"] = budget_verdict(spent_today_usd, spec.daily_budget_usd)
    return verdicts
