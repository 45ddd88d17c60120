"""Adaptive slow-down (AIMD) of a lane's rate, with a remembered ceiling.

The same rule as TCP congestion control: multiplicative decrease backs off fast enough to stop a
throttling storm, additive increase probes back towards the configured rate. Like TCP's ssthresh
(CUBIC's W_max), a lane remembers the factor it was throttled at: it climbs back quickly to just
under that ceiling, stays there a while, then probes upward slowly, so it settles under a lowered
limit instead of hitting it again every few seconds, and still finds a limit that was raised again.
Which lanes a signal cuts: the identity's it was sent as, and the source's only when corroborated
(`cuts_shared_lanes`).

The rate lanes apply these rules inside one SQL statement per lane (see `lanes.py`); this module is
the reference the tests hold that SQL to.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from investigations.collection.events import Outcome

if TYPE_CHECKING:  # specs pull in pydantic; pacing only needs their attributes at run time
    from investigations.sources.specs import ThrottleSpec

NO_CEILING = 1.0  # ceiling_factor of a lane never throttled: the configured rate is the only limit known
NEVER_CUT_S = 0.0  # last_cut_s of a lane never cut (epoch seconds: long ago)


@dataclass(frozen=True)
class AimdState:
    """A lane's AIMD state: its rate factor, the factor it was last throttled at, and when."""

    rate_factor: float = 1.0
    ceiling_factor: float = NO_CEILING
    last_cut_s: float = NEVER_CUT_S


def in_cut_hold(state: AimdState, now: float, spec: ThrottleSpec) -> bool:
    """Whether a throttle signal now belongs to the episode of the last cut."""
    return now - state.last_cut_s < spec.cut_hold_s


def target(state: AimdState, spec: ThrottleSpec) -> float:
    """The factor a lane climbs back to quickly: `ceiling_margin` under its remembered ceiling."""
    return state.ceiling_factor * (1.0 - spec.ceiling_margin)


def on_throttle(state: AimdState, now: float, spec: ThrottleSpec, *, fair_share: float = 0.0) -> AimdState:
    """The lane after a throttle signal: one cut per episode, remembering the factor it hit.

    `fair_share` (an identity's lane; 0 for the others): the factor at which this identity sends its
    share of what the source's shared lane lets through, among the source's identities. A refusal
    of an identity that sends no more than that says nothing about its own limit: a site-wide limit
    refuses whoever asks next. It is marked (`last_cut_s`, so the source's other identities'
    refusals corroborate it and cut the shared lane) but neither slows the identity nor lowers its
    ceiling, and a cut never takes the identity below its share. Without this, eight identities
    under a site-wide limit were each cut again and again for the site's refusals and walked down,
    each cut remembered as a lower ceiling, to half the site's rate in all over ten minutes
    (`bench.product`, limits configured 2x too high)."""
    # Within cut_hold_s of a cut: answers to requests sent at the old rate, already paid for.
    if in_cut_hold(state, now, spec):
        return state
    if state.rate_factor <= fair_share:
        return replace(state, last_cut_s=now)
    # The factor that was throttled is the ceiling; the cut itself is plain multiplicative decrease.
    return AimdState(rate_factor=max(decrease(state.rate_factor, spec), fair_share), ceiling_factor=state.rate_factor,
                     last_cut_s=now)


def fair_share(*, shared_rate_per_s: float, identities: int, identity_rate_per_s: float) -> float:
    """An identity lane's factor that sends `shared_rate_per_s / identities`: its share of what the
    source's shared lane lets through now. 0 (no share to keep) when the identities at their
    configured rates cannot fill the shared lane: a site-wide limit is then not what refuses them,
    so a refusal is the identity's own."""
    if identities < 1 or identity_rate_per_s <= 0 or shared_rate_per_s >= identities * identity_rate_per_s:
        return 0.0
    return shared_rate_per_s / identities / identity_rate_per_s


def share_cap(fair_share: float, spec: ThrottleSpec) -> float:
    """The highest factor an identity lane climbs to: its share of the source's shared lane (see
    `fair_share`) with `share_headroom` above it, or its configured rate (1) when it has no share.

    While the shared lane is what holds the source back, an identity sending faster than its share
    does not raise the source's rate: it takes its slots in bunches, and those bunches are what
    its own address's limit refuses. Eight identities configured 4x too fast, each climbing back
    and probing up to its own address's limit after every hold, were refused 2.4 % of the time
    after the first minute (`bench.product`'s `high4`); at their share they stay under it, and
    together they still have a quarter more than the shared lane lets through."""
    if fair_share <= 0:
        return 1.0
    return min(1.0, fair_share * (1.0 + spec.share_headroom))


def probe_step(spec: ThrottleSpec, rate_per_s: float) -> float:
    """What one success adds to the factor of a lane configured at `rate_per_s` while it probes:
    `probe_step / rate_per_s`, so the lane's rate grows by `probe_step` of itself a second whatever
    its configured rate (a lane sending at factor f has rate_per_s x f successes a second).

    A step per success made a fast lane probe fast: a source lane configured at 60 r/s (2x too high)
    probing by 0.005 a success grew by 8 r/s a second at the end of each hold, past a site-wide
    limit of 30 before its refusals could corroborate a cut, and was refused about 20 times every
    two minutes (`bench.product`'s `high`: 0.6 % of its requests after the first 30 s; paced in time, 0.1 %)."""
    return spec.probe_step / rate_per_s


def on_success(state: AimdState, now: float, spec: ThrottleSpec, *, fair_share: float = 0.0,
               rate_per_s: float = 1.0) -> AimdState:
    """The lane after a success: climb fast to just under the ceiling, hold, then probe slowly (see
    `probe_step`; `rate_per_s` the lane's configured rate); an identity lane (`fair_share`, see
    `on_throttle`) never above its `share_cap`."""
    # At its configured rate: never refused there, or probed back to it; only a refusal moves it
    # (so most successes, on lanes never cut, need no write: `RateLanes.feedback`).
    if state.rate_factor >= 1.0:
        return state
    cap = share_cap(fair_share, spec)
    goal = min(target(state, spec), cap)
    # Above what it can use of the shared lane: down to its cap (the ceiling stays as learned).
    if state.rate_factor > cap:
        return replace(state, rate_factor=cap)
    # Under the target: the rate there worked before the last cut, so win it back quickly.
    if state.rate_factor < goal:
        return replace(state, rate_factor=min(goal, state.rate_factor + spec.increase_step))
    # At the target: just under the rate that was throttled; stay a while instead of hitting it again.
    if now - state.last_cut_s < spec.ceiling_hold_s:
        return state
    # Held long enough: creep upward, in case the source raised its limit again.
    return replace(state, rate_factor=min(cap, state.rate_factor + probe_step(spec, rate_per_s)))


def cuts_shared_lanes(*, sent_as_identity: bool, others_cut: int, others: int, spec: ThrottleSpec,
                      retry_after: bool = False) -> bool:
    """Whether a throttle signal cuts the lanes a request shares with the source's other identities
    (the source lane), or only the lane of the identity it was sent as.

    A site with a limit per address refuses the one address that sends too fast; a site-wide limit
    refuses whoever asks next, so its refusals reach several identities within a second or two.
    `others_cut` of the source's `others` identities (those with a lane: they have sent) were cut
    within `corroborate_s`; the shared lanes are cut when that makes `corroborate_identities` with
    this one (fewer when the source has fewer identities, at least one other). One identity
    refused says nothing about the site-wide rate: cutting the shared lane for it would slow every
    identity (and, under a per-address limit, take the source lane below the site's real limit,
    one identity's refusal after another). Nor do two refusals of a large pool within seconds:
    eight identities configured too fast, each probing back up after its cut, were refused by their
    own address's limit a few times a minute, and every pair within 10 s cut the source lane again,
    down to 0.6 of the site's limit (`bench.product`'s `high4`). With spare identities, one
    identity slowed costs the source nothing. A request sent without an
    identity has only shared lanes: they are cut. So is every lane when the site said when to come
    back (`retry_after`): it spoke, and a site-wide limit that answers with Retry-After refuses so
    rarely once obeyed that its refusals seldom reach two identities within the window (measured:
    `bench.convergence` kept being refused, 21 times after the drop against 8).
    """
    if not sent_as_identity or retry_after or spec.corroborate_s <= 0:
        return True
    return others_cut >= max(1, min(spec.corroborate_identities - 1, others))


def decrease(factor: float, spec: ThrottleSpec) -> float:
    """The rate factor after a cut: `factor x decrease_factor`, never below `min_factor`."""
    # Floored: a lane at zero would never send the request that tells us the source is back.
    return max(spec.min_factor, factor * spec.decrease_factor)


def is_throttle_signal(outcome: Outcome, *, timed_out: bool = False) -> bool:
    """Whether a response asks us to slow down: a 429/503 (THROTTLED), or a request that timed out.

    A timeout counts because an overloaded source often stops answering before it starts refusing;
    other failures (blocks, 4xx, connection resets) say nothing about our rate.
    """
    return outcome is Outcome.THROTTLED or timed_out
