"""Rate lanes: GCRA pacing shared by every run and process through the state store.

A lane ("source:<name>" or "identity:<source>:<identity>") keeps one row: the theoretical arrival
time (TAT) of its next request, a Retry-After floor, an AIMD factor on its configured rate and the
remembered ceiling of that factor (the factor last throttled and when it was cut; see aimd). A
request reserves a slot on every lane it travels on, in one transaction, and then sleeps until the
latest of those slots: the database, not any one process, decides who goes when.

- rhythm guard: an identity lane is what one visitor looks like to a site, and a site bans an
  address whose recent gaps are too regular. Such a lane also keeps the planned times of its last
  sends, in the same row so that every process sees what the others sent. A request whose gaps
  would come out too regular is not granted: nothing is reserved, and the identity's lane gets a
  floor (like a Retry-After) at the first moment that breaks the rhythm (see
  GapSampler.rhythm_extra_s). Holding the send instead would keep its slot on the shared source
  lane, and every other identity waiting behind it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Connection, case, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from investigations.collection.events import Outcome
from investigations.pacing import aimd
from investigations.pacing.jitter import RHYTHM_SENDS_KEPT, GapSampler
from investigations.store import schema as s
from investigations.store.state import StateStore

if TYPE_CHECKING:  # specs pull in pydantic; pacing only needs their attributes at run time
    from investigations.sources.specs import SourceSpec, ThrottleSpec

_T = s.rate_lanes


@dataclass(frozen=True)
class LaneSpec:
    """A lane's name and configured limits: `rate_per_s` on average, up to `burst` back to back.

    `guard_rhythm`: the lane is one address as a site sees it, whose gaps must not look mechanical
    (see the rhythm guard in the module doc).
    """

    name: str
    rate_per_s: float
    burst: int
    guard_rhythm: bool = False

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0:
            raise ValueError(f"lane {self.name!r}: rate_per_s ({self.rate_per_s}) must be > 0")
        if self.burst < 1:
            raise ValueError(f"lane {self.name!r}: burst ({self.burst}) must be >= 1")


def source_lane(spec: SourceSpec) -> LaneSpec:
    """The lane every request to the source shares, whatever identity it goes out as."""
    return LaneSpec(f"source:{spec.name}", spec.rate.source_per_s, spec.rate.source_burst)


IDENTITY_LANE_PREFIX = "identity:"


def identity_lane_name(source: str, identity_id: str) -> str:
    """The name of `identity_id`'s lane at `source` (the identity pool reads lanes by it)."""
    return f"{IDENTITY_LANE_PREFIX}{source}:{identity_id}"


def is_identity_lane(name: str) -> bool:
    """Whether the lane is one identity's at a source (not a lane every request to the source shares)."""
    return name.startswith(IDENTITY_LANE_PREFIX)


# An identity lane reserved or told of an answer this recently is one of the source's identities
# sending now; it shares the source's lane with the others (`aimd.fair_share`).
ACTIVE_IDENTITY_S = 10.0


def _other_identities(conn: Connection, identity: Sequence[LaneSpec], *, cut_since_s: float,
                      active_since_s: float) -> tuple[int, int, int]:
    """Of the same source's other identities (not `identity`; those with a lane, so that have sent):
    how many were cut after `cut_since_s`, how many there are, and how many were used after
    `active_since_s`."""
    prefixes = sorted({lane.name.rsplit(":", 1)[0] + ":" for lane in identity})
    same_source = or_(*(func.substr(_T.c.lane, 1, len(prefix)) == prefix for prefix in prefixes))
    cut, total, active = conn.execute(select(
        func.count().filter(_T.c.last_cut_s > cut_since_s), func.count(),
        func.count().filter(_T.c.updated_at_s > active_since_s)).where(
        same_source, _T.c.lane.not_in([lane.name for lane in identity]))).one()
    return int(cut or 0), int(total or 0), int(active or 0)


def _shared_rate_per_s(conn: Connection, shared: Sequence[LaneSpec]) -> float:
    """What the request's shared lanes (the source's) let through now: the slowest one's configured
    rate times its factor (a lane without a row yet runs at its configured rate); 0 without any."""
    if not shared:
        return 0.0
    factors = dict(conn.execute(select(_T.c.lane, _T.c.rate_factor).where(
        _T.c.lane.in_([lane.name for lane in shared]))).all())
    return min(lane.rate_per_s * float(factors.get(lane.name, 1.0)) for lane in shared)


def identity_lane(spec: SourceSpec, identity_id: str) -> LaneSpec:
    """The lane of one identity on one source: what the source sees from that one visitor."""
    return LaneSpec(identity_lane_name(spec.name, identity_id), spec.rate.identity_per_s, spec.rate.identity_burst,
                    guard_rhythm=True)


@dataclass(frozen=True)
class Reservation:
    """Whether a slot was reserved and how long to sleep before sending (the wait if refused)."""

    granted: bool
    wait_s: float
    delay_s: float = 0.0  # the part of wait_s that is jitter after the slot opened
    # The lane whose slot the request waited for (None: it went at once), and that wait in the
    # lane's intervals: more than one means other requests were ahead in that lane's queue.
    held_by: str | None = None
    held_intervals: float = 0.0
    # > 0: refused by the rhythm guard, which would have had the send leave this much later; the
    # identity's lane opens again in wait_s (a floor on the lane), and asking before then is no use.
    rhythm_extra_s: float = 0.0
    # > 0: refused because the slot lay further ahead than a background request may book; ask
    # again after this long, when the slot comes within the horizon (see `reserve`).
    yield_s: float = 0.0


@dataclass(frozen=True)
class LaneState:
    """One row of `rate_lanes`."""

    lane: str
    tat_s: float
    not_before_s: float
    rate_factor: float
    updated_at_s: float
    ceiling_factor: float  # the factor last throttled at; 1 = no ceiling known
    last_cut_s: float  # when the factor was last cut; 0 = never
    recent_sends_s: tuple[float, ...] = ()  # planned times of a guarded lane's last sends, oldest first

    @property
    def aimd_state(self) -> aimd.AimdState:
        """The lane's AIMD state, as the reference rules in `aimd` take it."""
        return aimd.AimdState(self.rate_factor, self.ceiling_factor, self.last_cut_s)


@dataclass(frozen=True)
class _Slot:
    lane: LaneSpec
    start_s: float  # the lane's GCRA start: max(tat, now, not_before)
    gap_s: float  # what this request added to the lane's TAT: one interval and its slack
    interval_s: float  # the lane's permitted interval at this moment
    send_at_s: float  # the earliest moment this lane lets the request go
    recent_sends_s: tuple[float, ...]  # the lane's remembered sends (rhythm guard), as the row held them


class RateLanes:
    """GCRA rate lanes in the state store, with heavy-tailed gaps and AIMD on throttle signals."""

    def __init__(
        self, store: StateStore, *, sampler: GapSampler, clock: Callable[[], float] = time.time
    ) -> None:
        self._store = store
        self._sampler = sampler
        self._clock = clock

    def reserve(self, lanes: Sequence[LaneSpec], *, max_wait_s: float,
                max_ahead_intervals: float | None = None) -> Reservation:
        """Reserve the next slot on every lane in one transaction; the caller sleeps `wait_s`, then sends.

        Per lane: interval = 1 / (rate x factor), burst tolerance tau = (burst' - 1) x interval with
        the burst scaled like the rate (`effective_burst`), start = max(tat, now, not_before), the
        slot opens at max(now, start - tau, not_before), and the TAT moves to start + interval x
        (1 + a small heavy-tailed slack): slots are never closer than GCRA allows, so they never
        exceed what a strict limiter allows, and their phase wanders. The request then leaves a
        heavy-tailed delay after its slot opens (see jitter), which is what makes the sends
        irregular. When the wait exceeds `max_wait_s` nothing is reserved (rolled back) and
        `granted` is False, so the caller can park the work instead of holding a worker asleep. When the rhythm guard finds the planned send would close too regular a run of gaps
        on a guarded lane, nothing is reserved either; the lane's floor moves to the first moment
        that breaks the run, and `rhythm_extra_s` says so: ask again after `wait_s`.

        `max_ahead_intervals` is the booking horizon of background work: a slot further ahead than
        that many intervals of the binding lane is not reserved, and `yield_s` says when to ask
        again (when it comes within the horizon, plus up to an interval at random, so waiting
        requests do not all ask at once). A lane's booking then never runs more than the horizon
        ahead of now because of background requests, and a fresh lead's request, which books
        without a horizon, takes the next slot instead of queueing behind every waiting batch.
        """
        ordered = _unique_sorted(lanes)
        if not ordered:
            return Reservation(granted=True, wait_s=0.0)
        with self._store.engine.connect() as conn, conn.begin() as tx:
            # The lanes' rows locked first (SQLite: BEGIN IMMEDIATE holds the write lock already),
            # then the clock read: a request that waited for another's lock must not date its slot
            # from before the wait. Slots dated in the past all open at once when the lock frees, a
            # burst the lanes never meant (seen: six sends in 0.23 s at 8/s after a 0.6 s lock wait).
            if conn.dialect.name == "postgresql":
                conn.execute(select(_T.c.lane).where(_T.c.lane.in_([lane.name for lane in ordered]))
                             .order_by(_T.c.lane).with_for_update())
            now = self._clock()
            slots = [self._take_slot(conn, lane, now) for lane in ordered]
            binding = max(slots, key=lambda slot: slot.send_at_s)
            send_at = binding.send_at_s
            scale = delay_scale_s(slots)
            delay = self._sampler.send_delay_s(scale)
            planned = send_at + delay
            wait = planned - now
            # The guard judges the send as planned, jitter included; the strictest guarded lane decides.
            guard = self._sampler.rhythm_extra_s
            extra = max((guard(slot.recent_sends_s, planned, scale) for slot in slots if slot.lane.guard_rhythm),
                        default=0.0)
            horizon = None if max_ahead_intervals is None else max_ahead_intervals * binding.interval_s
            beyond = 0.0 if horizon is None else send_at - now - horizon
            if extra > 0 or wait > max_wait_s or beyond > 0:
                tx.rollback()
            else:
                for slot in slots:
                    changes: dict[str, Any] = {}
                    # A lane held back by a slower one sees the request when it really leaves (GCRA
                    # arrival time), else its next slot would fall right on top of this send.
                    if send_at > slot.start_s:
                        changes["tat_s"] = send_at + slot.gap_s
                    if slot.lane.guard_rhythm:
                        changes["recent_sends"] = _sends_text([*slot.recent_sends_s, planned])
                    if changes:
                        conn.execute(update(_T).where(_T.c.lane == slot.lane.name).values(changes))
        if extra > 0:
            resume_at = planned + extra
            guarded = [slot.lane.name for slot in slots if slot.lane.guard_rhythm]
            with self._store.engine.begin() as conn:
                greatest, _ = _max_min(conn)
                conn.execute(update(_T).where(_T.c.lane.in_(guarded))
                             .values(not_before_s=greatest(_T.c.not_before_s, resume_at)))
            return Reservation(granted=False, wait_s=resume_at - now, rhythm_extra_s=extra)
        if wait > max_wait_s:
            return Reservation(granted=False, wait_s=wait)
        if beyond > 0:
            return Reservation(granted=False, wait_s=wait, held_by=binding.lane.name,
                               held_intervals=(send_at - now) / binding.interval_s,
                               yield_s=beyond + self._sampler.rng.uniform(0.0, binding.interval_s))
        if send_at <= now:
            return Reservation(granted=True, wait_s=wait, delay_s=delay)
        return Reservation(granted=True, wait_s=wait, delay_s=delay, held_by=binding.lane.name,
                           held_intervals=(send_at - now) / binding.interval_s)

    def think_s(self, period_s: float) -> float:
        """A think time for an identity that takes turns on a shared lane (see GapSampler.think_s)."""
        return self._sampler.think_s(period_s)

    def feedback(
        self,
        lanes: Sequence[LaneSpec],
        *,
        outcome: Outcome,
        timed_out: bool = False,
        retry_after_s: float | None,
        throttle: ThrottleSpec,
        pooled_identity: bool = False,
    ) -> bool:
        """Tell the lanes how a request went: throttle signals cut the rate, successes restore it.

        One atomic statement per lane, the SQL twin of `aimd.on_throttle` / `aimd.on_success` (the
        right-hand sides of an UPDATE read the row as it was, as the reference does). A throttle of
        a request sent as one of the pool's identities (`pooled_identity`: through its proxy, one
        address among several; not the fleet's own direct address, the only one it has without a
        pool) cuts that identity's lane, and the source's shared lanes only when enough other
        identities of the source were cut within `corroborate_s` (`corroborate_identities` in all)
        or the answer carried a Retry-After (`aimd.cuts_shared_lanes`). An identity refused while it
        sends no more than its share of the shared lanes is not slowed by it, and no cut takes it
        below that share (`aimd.fair_share`, `aimd.on_throttle`), nor does a success take it above
        the share with its headroom (`aimd.share_cap`, `aimd.on_success`). A Retry-After is a hard
        floor on every lane: nothing leaves it before now + retry_after_s, whatever burst is left,
        even when the signal falls in the hold after a cut.

        Returns whether the signal was a throttle of a pooled identity that fell in its lane's hold
        (`cut_hold_s` after the lane's last cut), so did not cut it: the same episode of being too
        fast as the throttle that cut it, answered to requests that left before the cut took hold.
        The caller holds that episode against the identity once (`Fetcher`), not once per refusal.
        """
        now = self._clock()
        throttled = aimd.is_throttle_signal(outcome, timed_out=timed_out)
        succeeded = outcome is Outcome.OK and not timed_out
        floor = now + retry_after_s if retry_after_s is not None and retry_after_s > 0 else None
        if not (throttled or succeeded or floor is not None):
            return False  # nothing to learn from it: leave the row alone rather than write a no-op
        if succeeded and floor is None and self._all_at_full_rate(lanes):
            # A success changes nothing on a lane at its full rate (aimd.on_success): read, not written,
            # since every write waits for the state store's one writer on SQLite, and most answers
            # are successes of lanes never cut.
            return False
        identity = [lane for lane in lanes if is_identity_lane(lane.name)] if pooled_identity else []
        with self._store.engine.begin() as conn:
            greatest, least = _max_min(conn)
            base: dict[str, Any] = {"updated_at_s": now}
            if floor is not None:
                base["not_before_s"] = greatest(_T.c.not_before_s, floor)
            # Each identity lane's share of what the source's lane lets through, among the source's
            # identities sending now (aimd.fair_share; 0: no share to keep to); a shared lane's is 0.
            shares: dict[str, float] = {}
            cuts_shared = True
            if identity and (throttled or succeeded):
                others_cut, others, active = _other_identities(
                    conn, identity, cut_since_s=now - throttle.corroborate_s, active_since_s=now - ACTIVE_IDENTITY_S)
                shared_rate = _shared_rate_per_s(conn, [lane for lane in lanes if lane not in identity])
                shares = {lane.name: aimd.fair_share(shared_rate_per_s=shared_rate, identities=active + 1,
                                                     identity_rate_per_s=lane.rate_per_s) for lane in identity}
                if throttled and throttle.corroborate_s > 0 and floor is None:
                    cuts_shared = aimd.cuts_shared_lanes(sent_as_identity=True, others_cut=others_cut,
                                                         others=others, spec=throttle)
            # Sorted like reserve(), so two transactions never lock the same lanes in opposite orders.
            repeat = throttled and bool(identity)
            for lane in _unique_sorted(lanes):
                if not (cuts_shared or lane in identity):
                    continue  # a shared lane this throttle does not cut (there is no Retry-After floor to set)
                share = shares.get(lane.name, 0.0)
                # A lane's first row, when the feedback comes before any reservation.
                first = aimd.AimdState()
                changes = dict(base)
                if throttled:
                    changes.update(_throttle_sql(now, throttle, share, greatest))
                    first = aimd.on_throttle(first, now, throttle, fair_share=share)
                elif succeeded:
                    changes.update(_success_sql(now, throttle, share, least, rate_per_s=lane.rate_per_s))
                    first = aimd.on_success(first, now, throttle, fair_share=share, rate_per_s=lane.rate_per_s)
                row = {"lane": lane.name, "tat_s": now, "not_before_s": floor or 0.0, "updated_at_s": now,
                       **_aimd_columns(first)}
                stmt = _insert(conn).values(row).on_conflict_do_update(index_elements=["lane"], set_=changes)
                if throttled and lane in identity:
                    # The lane's last cut as the statement left it: now when this throttle cut it.
                    last_cut_after = conn.execute(stmt.returning(_T.c.last_cut_s)).scalar_one()
                    repeat = repeat and last_cut_after < now
                else:
                    conn.execute(stmt)
        return repeat

    def _all_at_full_rate(self, lanes: Sequence[LaneSpec]) -> bool:
        """Whether every lane has its row and runs at its configured rate (factor 1)."""
        names = {lane.name for lane in lanes}
        with self._store.reading() as conn:
            factors = conn.execute(select(_T.c.rate_factor).where(_T.c.lane.in_(names))).scalars().all()
        return len(factors) == len(names) and all(factor >= 1.0 for factor in factors)

    def state(self, name: str) -> LaneState | None:
        """The stored state of one lane, or None before its first request."""
        with self._store.engine.begin() as conn:
            row = conn.execute(select(_T).where(_T.c.lane == name)).mappings().first()
        return _lane_state(row) if row else None

    def all_states(self) -> list[LaneState]:
        """Every lane's stored state, by name (for the fleet status and the CLI)."""
        with self._store.engine.begin() as conn:
            return [_lane_state(row) for row in conn.execute(select(_T).order_by(_T.c.lane)).mappings()]

    def _take_slot(self, conn: Connection, lane: LaneSpec, now: float) -> _Slot:
        # The slot's length in intervals is drawn here and scaled inside the statement by the factor
        # the row holds at that moment: reading the factor first would be a race.
        units = self._sampler.slot_units()
        greatest, _ = _max_min(conn)
        first = {"lane": lane.name, "tat_s": now + units / lane.rate_per_s, "not_before_s": 0.0,
                 "updated_at_s": now, **_aimd_columns(aimd.AimdState())}
        gcra_start = greatest(_T.c.tat_s, now, _T.c.not_before_s)
        stmt = (
            _insert(conn)
            .values(first)
            .on_conflict_do_update(
                index_elements=[_T.c.lane],
                set_={"tat_s": gcra_start + units / (lane.rate_per_s * _T.c.rate_factor), "updated_at_s": now},
            )
            .returning(_T.c.tat_s, _T.c.not_before_s, _T.c.rate_factor, _T.c.recent_sends)
        )
        tat, not_before, factor, recent_sends = conn.execute(stmt).one()
        interval = 1.0 / (lane.rate_per_s * factor)
        gap = units * interval
        start = tat - gap
        tau = (effective_burst(lane.burst, factor) - 1) * interval
        # The burst tolerance lets a request go up to tau before its slot; Retry-After is a hard floor.
        return _Slot(lane=lane, start_s=start, gap_s=gap, interval_s=interval,
                     send_at_s=max(now, start - tau, not_before), recent_sends_s=_parse_sends(recent_sends))


def _throttle_sql(now: float, throttle: ThrottleSpec, share: float,
                  greatest: Callable[..., ColumnElement[Any]]) -> dict[str, Any]:
    """The SQL twin of `aimd.on_throttle` (the right-hand sides of an UPDATE read the row as it was,
    as the reference does): a lane's columns after a throttle signal, `share` its fair share (0: none)."""
    factor, ceiling, last_cut = _T.c.rate_factor, _T.c.ceiling_factor, _T.c.last_cut_s
    held = now - last_cut < throttle.cut_hold_s
    spared = factor <= share  # at or under its share: marked, neither slowed nor given a lower ceiling
    return {
        "rate_factor": case((held, factor), (spared, factor),
                            else_=greatest(throttle.min_factor, share, factor * throttle.decrease_factor)),
        "ceiling_factor": case((held, ceiling), (spared, ceiling), else_=factor),
        "last_cut_s": case((held, last_cut), else_=now),
    }


def _success_sql(now: float, throttle: ThrottleSpec, share: float, least: Callable[..., ColumnElement[Any]], *,
                 rate_per_s: float) -> dict[str, Any]:
    """The SQL twin of `aimd.on_success`: the rate factor after a success of a lane configured at
    `rate_per_s`, `share` its fair share (0: none, so no cap under its configured rate)."""
    factor, ceiling, last_cut = _T.c.rate_factor, _T.c.ceiling_factor, _T.c.last_cut_s
    cap = aimd.share_cap(share, throttle)
    goal = least(ceiling * (1.0 - throttle.ceiling_margin), cap)
    return {"rate_factor": case(
        (factor >= 1.0, factor),
        (factor > cap, cap),
        (factor < goal, least(goal, factor + throttle.increase_step)),
        (now - last_cut < throttle.ceiling_hold_s, factor),
        else_=least(cap, factor + aimd.probe_step(throttle, rate_per_s)),
    )}


def effective_burst(burst: int, factor: float) -> float:
    """The back-to-back allowance of a lane at AIMD `factor`: its configured burst scaled like its rate,
    never below one request.

    GCRA's tolerance is (burst - 1) intervals, and a slowed lane's interval is longer: a burst kept
    whole would let the lane save up credit over a window 1 / factor times as long, and a source
    that refused it for sending too fast would see the same burst of sends after every lull. A
    source configured 4x too fast has its burst 4x too large as well (bench.product's `high4`: bursts
    of 20 into a site-wide zone of 5 kept the source lane being cut, down to 0.6 of the ceiling).
    Scaled, the allowance lasts as many seconds as configured at any factor, and a lane never cut
    (factor 1) keeps its burst exactly."""
    return max(1.0, burst * factor)


def delay_scale_s(slots: Sequence[_Slot]) -> float:
    """The interval a request's send delay is drawn at: the fastest lane's. A send leaves at most
    one such interval after its slot, so each lane sees at most one request above its permitted
    count in any window (its burst, one below the site's, covers it): drawn at a slow identity
    lane's scale, sends would bunch on the shared source lane past a site-wide limit (measured: a
    429 from nginx's site-wide zone about once every 1,000 requests), and an identity sends one
    request at a time, so a long delay is also its rate lost for good. An address's gaps stay
    irregular by the collections' own work between sends, and the rhythm guard holds them above
    its floor."""
    return min(slot.interval_s for slot in slots)


def _parse_sends(text: str) -> tuple[float, ...]:
    return tuple(float(part) for part in text.split(",") if part)


def _sends_text(sends_s: Sequence[float]) -> str:
    # repr gives back the very float: the next reservation judges the gaps exactly as they were planned.
    return ",".join(repr(t) for t in sorted(sends_s)[-RHYTHM_SENDS_KEPT:])


def _lane_state(row: Any) -> LaneState:
    fields = dict(row)
    recent_sends = _parse_sends(fields.pop("recent_sends"))
    return LaneState(**fields, recent_sends_s=recent_sends)


def _aimd_columns(state: aimd.AimdState) -> dict[str, float]:
    return {"rate_factor": state.rate_factor, "ceiling_factor": state.ceiling_factor, "last_cut_s": state.last_cut_s}


def _unique_sorted(lanes: Sequence[LaneSpec]) -> list[LaneSpec]:
    # Lanes are locked in name order so concurrent reservations cannot deadlock on Postgres.
    return sorted({lane.name: lane for lane in reversed(lanes)}.values(), key=lambda lane: lane.name)


def _insert(conn: Connection) -> Any:
    return (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(_T)


def _max_min(conn: Connection) -> tuple[Callable[..., ColumnElement[Any]], Callable[..., ColumnElement[Any]]]:
    # SQLite's scalar max()/min() take several arguments; Postgres calls them GREATEST/LEAST.
    if conn.dialect.name == "postgresql":
        return func.greatest, func.least
    return func.max, func.min
