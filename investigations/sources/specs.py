"""Source specs: `sources.yaml` validated into typed, frozen models before anything is built on it.

A source is data. An unknown key, a missing field or an impossible value fails at load with the
file, the source and the key named, so a typo never turns into a silently different fleet.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from investigations.adapters import ADAPTERS
from investigations.adapters.base import TEMPLATE_FIELDS, ParseModel
from investigations.intake.leads import LEAD_KINDS, Lead, LeadError, normalize_lead
from investigations.net.guard import TargetAllowance, url_origin
from investigations.net.redaction import register_secret
from investigations.sources.yamlkit import EnvMissing, UniqueKeyLoader, describe_errors, expand_env, merge_defaults

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_DURATION_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}

Positive = Annotated[float, Field(gt=0)]


def parse_duration_s(value: Any) -> float:
    """`90`, `"90s"`, `"15m"`, `"6h"`, `"1d"` -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif match := _DURATION.match(str(value)):
        seconds = float(match.group(1)) * _DURATION_UNIT_S[match.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration like 90, '15m', '6h' or '1d'")
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def duration_text(seconds: float) -> str:
    """Seconds as the file writes them: `30d`, `6h`, `15m`, `90s` (the largest whole unit)."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"

class SpecError(ValueError):
    """The sources file is broken; the message names the file, the source and the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateSpec(_Model):
    """Request rates, shared by every run and process (enforced by the rate lanes)."""

    source_per_s: Positive = 1.0
    source_burst: int = Field(default=1, ge=1)
    identity_per_s: Positive = 1.0
    identity_burst: int = Field(default=1, ge=1)


class RetrySpec(_Model):
    """How often one request is tried and how long to wait between tries (full jitter)."""

    attempts: int = Field(default=3, ge=1, le=20)
    base_delay_s: Positive = 1.0
    max_delay_s: Positive = 60.0
    # Dagster's RetryPolicy: re-runs of a crashed step (a killed worker, an exception outside the
    # fetcher); request-level failures are the fetcher's business, not this.
    step_retries: int = Field(default=1, ge=0, le=10)

    @model_validator(mode="after")
    def _max_not_below_base(self) -> RetrySpec:
        if self.max_delay_s < self.base_delay_s:
            raise ValueError(f"max_delay_s ({self.max_delay_s}) is below base_delay_s ({self.base_delay_s})")
        return self


class ThrottleSpec(_Model):
    """Adaptive slow-down (AIMD): how hard 429/503/timeouts cut a lane's rate and how it recovers.

    A cut remembers the factor that was throttled (the ceiling): successes climb back by
    `increase_step` to `ceiling_margin` under it, hold there `ceiling_hold_s`, then probe upward by
    `probe_step`. A request sent as an identity cuts that identity's lane; the source's lane only
    when `corroborate_identities` of its identities were cut within `corroborate_s` (see
    `aimd.cuts_shared_lanes`).
    """

    decrease_factor: float = Field(default=0.5, gt=0, lt=1)  # rate *= this on a throttle signal
    increase_step: float = Field(default=0.05, gt=0, le=1)  # factor += this on a success, up to the target
    min_factor: float = Field(default=0.05, gt=0, le=1)  # never below this share of the configured rate
    cut_hold_s: float = Field(default=2.0, ge=0)  # throttle signals this soon after a cut do not cut again
    ceiling_margin: float = Field(default=0.1, ge=0, lt=1)  # climb back to ceiling x (1 - this)
    ceiling_hold_s: float = Field(default=120.0, ge=0)  # then stay there this long after the cut
    # then the rate grows by this share of itself a second (factor += this / the configured rate on
    # a success), up to the configured rate
    probe_step: float = Field(default=0.005, gt=0, le=1)
    # A throttle of a request sent as an identity cuts the source's shared lane only when this many
    # of its identities (this one included; at most as many as have sent) were cut within
    # `corroborate_s` (0: always): a site-wide limit refuses whoever asks next, so its refusals
    # reach several identities within a second or two; a per-address limit refuses the one address
    # sending too fast, and two such within a long window are a coincidence of a large pool.
    corroborate_s: float = Field(default=3.0, ge=0)
    corroborate_identities: int = Field(default=3, ge=2)
    # An identity whose source lane lets through less than the source's active identities could send
    # climbs no higher than its share of that lane times (1 + this): more would not raise the
    # source's rate, only let the identity bunch its sends into its own address's limit.
    share_headroom: float = Field(default=0.25, ge=0)
    park_after_s: Positive = 120.0  # a collection throttled this long is parked, not failed

    @model_validator(mode="after")
    def _probe_not_above_increase(self) -> ThrottleSpec:
        if self.probe_step > self.increase_step:
            raise ValueError(f"probe_step ({self.probe_step}) is above increase_step ({self.increase_step}): "
                             "probing past a known ceiling must be slower than climbing back under it")
        return self


class CircuitSpec(_Model):
    """Circuit breaker: after `failure_threshold` failed collections in a row the source rests."""

    failure_threshold: int = Field(default=5, ge=1)
    cooldown_s: Positive = 30.0  # first rest; doubles on each re-open, up to max_cooldown_s
    max_cooldown_s: Positive = 600.0


DEFAULT_RECRAWL_S = 86_400.0


class RecrawlSpec(_Model):
    """How often a source's monitored leads are collected again (`investigations.scheduling.cadence`).

    Each lead gets its own interval within [`min`, `max`], from how often its answer has changed:
    new leads start from `every` (the source's typical change interval), and the source's recurring
    crawls spend what one collection of each lead per `every` would, within `share` of its rate and
    its daily budget. `min` = `max` is a fixed cadence (what `recrawl_every: X` means: every lead
    every X, whatever its history). A lead only closed cases hold weighs `closed_weight` (0: it is
    not collected again).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    min_s: float = Field(default=3_600.0, alias="min")
    max_s: float = Field(default=30 * 86_400.0, alias="max")
    every_s: float | None = Field(default=None, alias="every")  # None: the geometric mean of min and max
    share: float = Field(default=0.5, gt=0, le=1)  # of rate.source_per_s, for recurring crawls
    closed_weight: float = Field(default=0.0, ge=0, le=1)

    @field_validator("min_s", "max_s", "every_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float | None:
        return None if value is None else parse_duration_s(value)

    @model_validator(mode="after")
    def _min_not_above_max(self) -> RecrawlSpec:
        if self.min_s > self.max_s:
            raise ValueError(f"min ({duration_text(self.min_s)}) is above max ({duration_text(self.max_s)})")
        return self

    @classmethod
    def fixed(cls, seconds: float) -> RecrawlSpec:
        """Every lead every `seconds`, whatever its history (the old `recrawl_every`)."""
        return cls.model_validate({"min": seconds, "max": seconds, "every": seconds})

    @property
    def is_fixed(self) -> bool:
        return self.min_s == self.max_s

    @property
    def prior_s(self) -> float:
        """The source's typical change interval: `every`, else the geometric mean of min and max."""
        return self.every_s if self.every_s is not None else math.sqrt(self.min_s * self.max_s)


class RequestSpec(_Model):
    """The request made for a lead. `url` may use {kind}, {value} (url-quoted) and {lead_id}.

    The SSRF guard lets this request reach a private address only at the origin (scheme, host,
    port) `url` names, when its host has no placeholder, and in the CIDR blocks listed in
    `private_networks` (for operators whose source lives in their own network and redirects within
    it). Nothing else, a lead's value or a redirect included, widens that.
    """

    url: str
    method: Literal["GET", "POST"] = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    # Sent as `Authorization: Bearer <token>` when not empty, so `"${GITHUB_TOKEN:-}"` makes a key
    # optional: without it the source is asked anonymously (at its anonymous rate).
    bearer_token: str = ""
    private_networks: tuple[str, ...] = ()

    @field_validator("private_networks")
    @classmethod
    def _networks(cls, networks: tuple[str, ...]) -> tuple[str, ...]:
        for network in networks:
            try:
                ipaddress.ip_network(network, strict=True)
            except ValueError as exc:
                raise ValueError(f"private_networks entry {network!r} is not a CIDR block ({exc})") from None
        return networks

    @property
    def allowance(self) -> TargetAllowance:
        """What this request may reach on a private network (see the class docstring)."""
        origins = []
        netloc = urlsplit(self.url).netloc
        if "{" not in netloc and (origin := url_origin(self.url)) is not None:
            origins.append(origin)
        return TargetAllowance.build(origins, [ipaddress.ip_network(n) for n in self.private_networks])

    @field_validator("url")
    @classmethod
    def _url_template(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url {url!r} must start with http:// or https://")
        unknown = set(re.findall(r"\{([^}]*)\}", url)) - TEMPLATE_FIELDS
        if unknown:
            raise ValueError(f"url uses unknown placeholders {sorted(unknown)}; known: {sorted(TEMPLATE_FIELDS)}")
        return url


class RateLimitHeadersSpec(_Model):
    """A source's own rate-limit headers (GitHub's `x-ratelimit-*`, Mastodon's `X-RateLimit-*`).

    An answer with a status in `statuses` is the source's rate limit, not a refusal, when its
    remaining allowance is 0 or it names a Retry-After; the wait is the Retry-After, else the time
    until `reset`, else `default_wait_s`. A success that spends the last of the allowance makes the
    lane wait for `reset` too, so the next request does not go out only to be refused.
    """

    remaining: str = "x-ratelimit-remaining"
    reset: str = "x-ratelimit-reset"
    # epoch_s: Unix seconds (GitHub); iso: an ISO 8601 timestamp (Mastodon); delta_s: seconds from now
    reset_format: Literal["epoch_s", "iso", "delta_s"] = "epoch_s"
    statuses: tuple[int, ...] = (429,)
    default_wait_s: Positive = 60.0


class AnswersSpec(_Model):
    """What a source's statuses mean beyond HTTP's general rules (see `investigations.collection.classify`)."""

    # The source's "nothing here" (a 404 for an unknown user, Common Crawl's 404 for no captures):
    # an empty result, never a failure.
    empty_statuses: tuple[int, ...] = ()
    # The source's "slow down": wait (its Retry-After is a floor) without spending a retry attempt.
    slow_down_statuses: tuple[int, ...] = (429,)
    # The least wait after a "slow down" that names none: a source that keeps refusing a client
    # that comes back at once (the Wayback Machine) needs more than the retry backoff.
    slow_down_wait_s: Positive | None = None
    rate_limit: RateLimitHeadersSpec | None = None

    @model_validator(mode="after")
    def _disjoint(self) -> AnswersSpec:
        both = sorted(set(self.empty_statuses) & set(self.slow_down_statuses))
        if both:
            raise ValueError(f"statuses {both} are both empty_statuses and slow_down_statuses")
        bad = [s for s in (*self.empty_statuses, *self.slow_down_statuses) if not 100 <= s <= 599]
        if bad:
            raise ValueError(f"statuses {bad} are not HTTP statuses")
        return self


class CanarySpec(_Model):
    """A known-positive lead: the source must always find records for it (see `canaries`)."""

    kind: str
    value: str = Field(min_length=1)

    @model_validator(mode="after")
    def _normalizes(self) -> CanarySpec:
        try:
            normalize_lead(self.kind, self.value)
        except LeadError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def lead(self) -> Lead:
        return normalize_lead(self.kind, self.value)


class SourceSpec(_Model):
    """One source of the fleet: where and how to ask, how fast, how hard to retry, what to expect."""

    name: str
    description: str = ""
    adapter: str
    lead_kinds: tuple[str, ...] = Field(min_length=1)
    request: RequestSpec
    # The adapter's own parse model (`investigations.adapters`), chosen by `adapter` when read.
    parse: SerializeAsAny[ParseModel]
    answers: AnswersSpec = AnswersSpec()
    rate: RateSpec = RateSpec()
    concurrency: int = Field(default=1, ge=1, le=64)
    # Pool slots beyond `concurrency` that background runs never take: fresh leads arriving together
    # start at once while the source's batches run. The default matches dagster.yaml's headroom (6 - 3).
    interactive_slots: int = Field(default=3, ge=1, le=64)
    retry: RetrySpec = RetrySpec()
    throttle: ThrottleSpec = ThrottleSpec()
    circuit: CircuitSpec = CircuitSpec()
    # Backpressure for fresh leads: at most this many interactive collections of the source handed to
    # Dagster and not finished (one run each). Background work is bounded by its rate instead: whole
    # batches, in as many runs as the rate needs (see `investigations.scheduling.dispatch`).
    max_in_flight: int = Field(default=400, ge=1, le=10_000)
    # Background runs batch leads (about 90 s of work at the permitted rate), at most this many: a
    # run costs seconds of CPU to start, so small batches spend the machine on starting runs.
    batch_max_leads: int = Field(default=1000, ge=1, le=10_000)
    timeout_s: Positive = 10.0
    # `recrawl: {min, max, every, share, closed_weight}`, or `recrawl_every: X` (fixed: min = max = X).
    recrawl: RecrawlSpec = RecrawlSpec.fixed(DEFAULT_RECRAWL_S)
    identity_tier: str = "datacenter"
    # Spend a day (UTC) after which the source gets no more background work (recurring crawls,
    # backfills); interactive leads still go. 0 means no budget. See `investigations.scheduling.cost`.
    daily_budget_usd: float = Field(default=0.0, ge=0)
    # What keeping one GB of this source's captures (WARC evidence) costs, USD: the storage part of
    # the source's cost, beside its requests and proxy traffic.
    evidence_usd_per_gb: float = Field(default=0.0, ge=0)
    # What one request to the source itself costs (an API's price per call), on top of what the
    # identity it goes out as costs (the identities file's cost_per_request_usd and cost_per_mb_usd).
    cost_per_request_usd: float = Field(default=0.0, ge=0)
    expected_min_records: int = Field(default=0, ge=0)
    # Known-positive leads, collected on the source's cadence: one answering with no records fails
    # the source's `canaries_pass` check before any case notices.
    canaries: tuple[CanarySpec, ...] = ()
    # Text that marks a block or challenge page (matched case-insensitively at the top of a body):
    # such an answer counts against the identity that got it, whatever its status.
    block_markers: tuple[str, ...] = Field(default_factory=lambda: _default_block_markers())

    @model_validator(mode="before")
    @classmethod
    def _parse_by_adapter(cls, data: Any) -> Any:
        # The adapter decides which parse model applies (parse_sources reports its errors with their
        # `parse.` path first); a human-friendly duration becomes seconds.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "adapter" in data:
            adapter = data["adapter"]
            if not isinstance(adapter, str) or adapter not in ADAPTERS:
                raise ValueError(f"unknown adapter {adapter!r} (known: {', '.join(ADAPTERS)})")
            data["parse"] = ADAPTERS[adapter].parse_model.model_validate(data.get("parse") or {})
        return _fixed_recrawl(data)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"{name!r} must be lower-case letters, digits and '_', starting with a letter")
        return name

    @field_validator("lead_kinds")
    @classmethod
    def _kinds(cls, kinds: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [k for k in kinds if k not in LEAD_KINDS]
        if unknown:
            raise ValueError(f"unknown lead kinds {unknown} (known: {', '.join(LEAD_KINDS)})")
        return kinds

    @model_validator(mode="after")
    def _canaries_are_taken(self) -> SourceSpec:
        wrong = [c.kind for c in self.canaries if c.kind not in self.lead_kinds]
        if wrong:
            raise ValueError(f"canaries of kinds {wrong} that the source does not take (lead_kinds: "
                             f"{', '.join(self.lead_kinds)})")
        return self

    def accepts(self, kind: str) -> bool:
        return kind in self.lead_kinds

    @property
    def recrawl_every_s(self) -> float:
        """The longest a monitored lead goes without a collection: the fixed `recrawl_every`, or
        `recrawl.max` (what `fresh_within_cadence` allows)."""
        return self.recrawl.max_s


def _fixed_recrawl(data: dict[str, Any]) -> dict[str, Any]:
    """`recrawl_every: X` as `recrawl: {min: X, max: X, every: X}` (`recrawl_every_s`: a spec
    dumped before `recrawl:` existed, as case packages keep them)."""
    key = "recrawl_every" if "recrawl_every" in data else "recrawl_every_s" if "recrawl_every_s" in data else None
    if key is None:
        return data
    value = data.pop(key)
    if "recrawl" in data:
        raise ValueError("keys 'recrawl_every' and 'recrawl' are both set: keep one (recrawl_every: X is "
                         "recrawl: {min: X, max: X, every: X})")
    try:
        seconds = parse_duration_s(value)
    except ValueError as exc:
        raise ValueError(f"key 'recrawl_every': {exc}") from None
    return {**data, "recrawl": {"min": seconds, "max": seconds, "every": seconds}}


def _default_block_markers() -> tuple[str, ...]:
    # Imported when a spec is built, not at import: the identities package imports this module.
    from investigations.identities.health import DEFAULT_BLOCK_MARKERS

    return DEFAULT_BLOCK_MARKERS


class SourceCatalog(_Model):
    """All sources of the fleet, in file order, looked up by name."""

    sources: tuple[SourceSpec, ...]

    @model_validator(mode="after")
    def _unique(self) -> SourceCatalog:
        seen: set[str] = set()
        for spec in self.sources:
            if spec.name in seen:
                raise ValueError(f"source {spec.name!r} is declared twice")
            seen.add(spec.name)
        return self

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]

    def get(self, name: str) -> SourceSpec:
        for spec in self.sources:
            if spec.name == name:
                return spec
        raise KeyError(f"unknown source {name!r} (known: {', '.join(self.names)})")

    def for_kind(self, kind: str) -> list[SourceSpec]:
        return [s for s in self.sources if s.accepts(kind)]


def load_sources(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> SourceCatalog:
    """Read and validate a sources file; raise SpecError naming the file, source and key."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read sources file ({exc.strerror})") from None
    return parse_sources(text, origin=str(path), env=env)


def parse_sources(text: str, *, origin: str = "sources.yaml", env: Mapping[str, str] | None = None) -> SourceCatalog:
    env = os.environ if env is None else env
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise SpecError(f"{origin}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or set(raw) - {"sources", "defaults"} or not isinstance(raw.get("sources"), list):
        raise SpecError(f"{origin}: expected a mapping with a `sources:` list (and optional `defaults:`)")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise SpecError(f"{origin}: `defaults:` must be a mapping")
    entries = []
    secrets: list[str] = []
    for index, entry in enumerate(raw["sources"]):
        label = entry.get("name", f"#{index + 1}") if isinstance(entry, dict) else f"#{index + 1}"
        if not isinstance(entry, dict):
            raise SpecError(f"{origin}: source {label}: expected a mapping of settings")
        try:
            entries.append(expand_env(merge_defaults(defaults, entry), env, path=(), secrets=secrets))
        except EnvMissing as exc:
            raise SpecError(f"{origin}: source {label!r}: key {exc.key!r}: {exc}") from None
    problems = [_parse_block_problems(origin, entry) for entry in entries]
    if any(problems):
        raise SpecError("\n".join(line for lines in problems for line in lines))
    # Registered before validation, so even an error message quoting a value is redacted.
    for value in secrets:
        register_secret(value)
    try:
        return SourceCatalog.model_validate({"sources": entries})
    except ValidationError as exc:
        raise SpecError(describe_errors(origin, exc, entries, collection="sources", label="source",
                                        name_key="name")) from None


def _parse_block_problems(origin: str, entry: dict[str, Any]) -> list[str]:
    """Errors of an entry's `parse:` block, each with its full key path (`parse.records_path`)."""
    kind = ADAPTERS.get(entry["adapter"]) if isinstance(entry.get("adapter"), str) else None
    if kind is None:
        return []
    model = kind.parse_model
    try:
        model.model_validate(entry.get("parse") or {})
    except ValidationError as exc:
        return [_problem(origin, entry, ["parse", *err["loc"]], err) for err in exc.errors()]
    return []


def _problem(origin: str, entry: dict[str, Any], loc: list[Any], err: Any) -> str:
    message = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
    return f"{origin}: source {entry.get('name', '?')!r}: key {'.'.join(map(str, loc))!r}: {message}"
