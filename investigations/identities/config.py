"""Identities: `identities.yaml` validated into typed, frozen models before any request goes out.

An identity is what a request goes out as: a proxy (or a direct connection), the range/provider it
belongs to, a cost tier and a fingerprint that never changes. Credentials only ever come from the
environment (`${ENV_VAR}`); a password written into the file is an error, and a proxy URL is kept as
a `SecretStr`, so no repr, log line or lease ever shows it.

    tiers: [datacenter, residential]          # cheapest first: the order escalation climbs
    fingerprints:                              # named profiles (or inline under an identity)
      chrome_win: {user_agent: ..., accept_language: ..., headers: [[Accept, "text/html"], ...]}
    defaults: {tier: datacenter, fingerprint: chrome_win}
    identities:
      - id: dc1_a
        proxy_url: http://fleet:${PROXY_DC1_PASSWORD}@dc1.proxy.example.net:8080
        range: dc1
        cost_per_request_usd: 0.0001
        cost_per_mb_usd: 0.0

No file means one direct identity, `direct`, with the fleet's honest default fingerprint.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit, urlunsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

# The sources file's loader rules (duplicate keys refused, `${VAR}` / `${VAR:-default}` expansion,
# nested defaults) apply unchanged here: one dialect of YAML for the whole fleet.
from investigations.sources.yamlkit import (
    ENV_REF,
    EnvMissing,
    UniqueKeyLoader,
    describe_errors,
    expand_env,
    merge_defaults,
)

DIRECT_ID = "direct"
DIRECT_TIER = "direct"
# Same honest agent the fetcher sends when no identity is configured.
DEFAULT_USER_AGENT = "investigations-fleet/0.1 (collection fleet; contact via project README)"
DEFAULT_ACCEPT_LANGUAGE = "en-US,en;q=0.9"
# httpx puts its own defaults for these first unless the profile names them; naming them (with
# these values when the profile does not) keeps the whole header order the profile's.
_HTTPX_DEFAULTS = (("Accept", "*/*"), ("Accept-Encoding", "gzip, deflate"), ("Connection", "keep-alive"))
# What the fingerprint fills in from its own fields; a header pair may name them only to place them.
_FROM_FIELDS = ("user-agent", "accept-language")

_ID = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")  # ends up in lane names "identity:<source>:<id>"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token
_PROXY_SCHEMES = ("http", "https", "socks5", "socks5h")
# Content codings httpx can decode here; a fingerprint claiming more would receive bodies it can't read.
_DECODABLE = {"identity", "gzip", "deflate", "*"} | (
    {"br"} if importlib.util.find_spec("brotli") or importlib.util.find_spec("brotlicffi") else set()
) | ({"zstd"} if importlib.util.find_spec("zstandard") else set())

NonNegative = Annotated[float, Field(ge=0)]


class IdentityError(ValueError):
    """The identities file is broken; the message names the file, the identity and the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FingerprintSpec(_Model):
    """What a site sees of the client: one user agent, one language, one header set in one order."""

    user_agent: str = Field(min_length=1)
    accept_language: str = Field(min_length=1)
    # Ordered [name, value] pairs. `User-Agent` / `Accept-Language` may be named with an empty value
    # to place them; their values always come from the fields above.
    headers: tuple[tuple[str, str], ...] = ()

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        seen: set[str] = set()
        for name, value in headers:
            lower = name.lower()
            if not _HEADER_NAME.match(name):
                raise ValueError(f"header name {name!r} is not a valid HTTP header name")
            if lower in seen:
                raise ValueError(f"header {name!r} is listed twice")
            seen.add(lower)
            if lower in _FROM_FIELDS and value:
                field = lower.replace("-", "_")
                raise ValueError(f"header {name!r} takes its value from `{field}`; list it with \"\" to place it")
            if lower in ("host", "content-length", "cookie", "proxy-authorization"):
                raise ValueError(f"header {name!r} is set per request, not by the fingerprint")
            if lower == "accept-encoding":
                codings = {part.split(";")[0].strip().lower() for part in value.split(",") if part.strip()}
                if codings - _DECODABLE:
                    raise ValueError(
                        f"Accept-Encoding offers {sorted(codings - _DECODABLE)}, which this install cannot "
                        f"decode (decodable: {sorted(_DECODABLE - {'*'})})"
                    )
        return headers

    def ordered_headers(self) -> list[tuple[str, str]]:
        """Every header the identity sends, in order: User-Agent first and Accept-Language last unless
        the profile places them, then httpx's own defaults the profile left out (so httpx adds none)."""
        named = {name.lower() for name, _ in self.headers}
        values = {"user-agent": self.user_agent, "accept-language": self.accept_language}
        ordered = [] if "user-agent" in named else [("User-Agent", self.user_agent)]
        ordered += [(name, values.get(name.lower(), value)) for name, value in self.headers]
        if "accept-language" not in named:
            ordered.append(("Accept-Language", self.accept_language))
        ordered += [(name, value) for name, value in _HTTPX_DEFAULTS if name.lower() not in named]
        return ordered


DEFAULT_FINGERPRINT = FingerprintSpec(
    user_agent=DEFAULT_USER_AGENT,
    accept_language=DEFAULT_ACCEPT_LANGUAGE,
    headers=(("Accept", "text/html,application/json;q=0.9,*/*;q=0.8"),),
)


class IdentitySpec(_Model):
    """One identity: proxy (None = direct), range/provider, cost tier, costs and fingerprint."""

    id: str
    proxy_url: SecretStr | None = None
    range: str
    tier: str
    cost_per_request_usd: NonNegative = 0.0
    cost_per_mb_usd: NonNegative = 0.0
    fingerprint: FingerprintSpec = DEFAULT_FINGERPRINT

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _ID.match(value):
            raise ValueError(f"{value!r} must be lower-case letters, digits, '_' or '-', starting with a letter")
        return value

    @field_validator("range", "tier")
    @classmethod
    def _label(cls, value: str) -> str:
        if not _LABEL.match(value):
            raise ValueError(f"{value!r} must be letters, digits, '_', '.' or '-' (at most 64)")
        return value

    @field_validator("proxy_url")
    @classmethod
    def _proxy(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in _PROXY_SCHEMES:
            raise ValueError(f"proxy scheme must be one of {', '.join(_PROXY_SCHEMES)}, not {parts.scheme!r}")
        if parts.scheme.startswith("socks") and importlib.util.find_spec("socksio") is None:
            raise ValueError("a socks proxy needs httpx's socks extra (`pip install httpx[socks]`)")
        if not parts.hostname:
            raise ValueError("proxy URL has no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("proxy URL takes scheme://[user:${PASSWORD_VAR}@]host:port only")
        return value

    def proxy(self) -> str | None:
        """The proxy URL with its credentials, for the HTTP client only; never log it."""
        return self.proxy_url.get_secret_value() if self.proxy_url else None

    def redacted_proxy_url(self) -> str | None:
        """The proxy URL safe to show: the user name kept, the password replaced by `***`."""
        proxy = self.proxy()
        return redact_proxy_url(proxy) if proxy else None


class IdentityCatalog(_Model):
    """Every identity of the fleet, in file order, and the cost tiers cheapest first."""

    tiers: tuple[str, ...] = Field(min_length=1)
    identities: tuple[IdentitySpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> IdentityCatalog:
        if len(set(self.tiers)) != len(self.tiers):
            raise ValueError(f"tiers {list(self.tiers)} lists a tier twice")
        seen: set[str] = set()
        for identity in self.identities:
            if identity.id in seen:
                raise ValueError(f"identity {identity.id!r} is declared twice")
            seen.add(identity.id)
        return self

    @property
    def ids(self) -> list[str]:
        return [identity.id for identity in self.identities]

    def get(self, identity_id: str) -> IdentitySpec:
        for identity in self.identities:
            if identity.id == identity_id:
                return identity
        raise KeyError(f"unknown identity {identity_id!r}")

    def tier_rank(self, tier: str) -> int:
        """Position of `tier` in the cost order, 0 being the cheapest."""
        try:
            return self.tiers.index(tier)
        except ValueError:
            raise KeyError(f"unknown tier {tier!r} (tiers: {', '.join(self.tiers)})") from None


DIRECT_CATALOG = IdentityCatalog(
    tiers=(DIRECT_TIER,),
    identities=(IdentitySpec(id=DIRECT_ID, proxy_url=None, range=DIRECT_ID, tier=DIRECT_TIER),),
)


def redact_proxy_url(url: str) -> str:
    """`scheme://user:***@host:port`: whatever the password, it never reaches a log or the store."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:***" if colon else "***"  # a lone token in the user part is the secret
        host = f"{userinfo}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def load_identities(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None
) -> IdentityCatalog:
    """Read and validate an identities file; no file (None) gives the one direct identity.

    Raises IdentityError naming the file, the identity and the key.
    """
    if path is None:
        return DIRECT_CATALOG
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise IdentityError(f"{path}: cannot read identities file ({exc.strerror})") from None
    return parse_identities(text, origin=str(path), env=env)


def parse_identities(
    text: str, *, origin: str = "identities.yaml", env: Mapping[str, str] | None = None
) -> IdentityCatalog:
    env = os.environ if env is None else env
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise IdentityError(f"{origin}: not valid YAML: {exc}") from None
    allowed = {"tiers", "identities", "defaults", "fingerprints"}
    if not isinstance(raw, dict) or set(raw) - allowed or not isinstance(raw.get("identities"), list):
        raise IdentityError(
            f"{origin}: expected a mapping with `tiers:` and an `identities:` list "
            "(and optional `defaults:`, `fingerprints:`)"
        )
    if not raw["identities"]:
        raise IdentityError(f"{origin}: `identities:` is empty (leave INVESTIGATIONS_IDENTITIES unset for direct)")
    tiers = raw.get("tiers")
    if not isinstance(tiers, list) or not tiers or not all(isinstance(t, str) for t in tiers):
        raise IdentityError(f"{origin}: `tiers:` must list the tier names, cheapest first, e.g. [datacenter, residential]")
    defaults = raw.get("defaults") or {}
    profiles = raw.get("fingerprints") or {}
    if not isinstance(defaults, dict):
        raise IdentityError(f"{origin}: `defaults:` must be a mapping")
    if not isinstance(profiles, dict):
        raise IdentityError(f"{origin}: `fingerprints:` must map profile names to fingerprints")

    entries, problems = _entries(raw["identities"], defaults, profiles, tiers, origin=origin, env=env)
    if problems:
        raise IdentityError("\n".join(problems))
    try:
        return IdentityCatalog.model_validate({"tiers": tiers, "identities": entries})
    except ValidationError as exc:
        raise IdentityError(describe_errors(origin, exc, entries, collection="identities", label="identity",
                                            name_key="id")) from None


def _entries(identities: list[Any], defaults: dict[str, Any], profiles: dict[str, Any], tiers: list[str], *,
             origin: str, env: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each identity with the defaults under it, `${VAR}`s expanded and its fingerprint profile filled
    in; and the problems found (each naming the identity and key)."""
    entries: list[dict[str, Any]] = []
    problems: list[str] = []
    for index, entry in enumerate(identities):
        label = entry.get("id", f"#{index + 1}") if isinstance(entry, dict) else f"#{index + 1}"
        where = f"{origin}: identity {label!r}"
        if not isinstance(entry, dict):
            raise IdentityError(f"{where}: expected a mapping of settings")
        merged = merge_defaults(defaults, entry)
        try:
            expanded = _expand_entry(merged, env)
        except EnvMissing as exc:
            raise IdentityError(f"{where}: key {exc.key!r}: {exc}") from None
        except _LiteralSecret as exc:
            problems.append(f"{where}: key 'proxy_url': {exc}")
            continue
        fingerprint = expanded.get("fingerprint")
        if isinstance(fingerprint, str):
            if fingerprint not in profiles:
                known = ", ".join(map(str, profiles)) or "none declared"
                problems.append(f"{where}: key 'fingerprint': unknown profile {fingerprint!r} (profiles: {known})")
                continue
            expanded["fingerprint"] = expand_env(profiles[fingerprint], env, ("fingerprint",))
        if "tier" in expanded and expanded["tier"] not in tiers:
            problems.append(f"{where}: key 'tier': {expanded['tier']!r} is not one of tiers {tiers}")
            continue
        entries.append(expanded)
    return entries, problems


class _LiteralSecret(ValueError):
    pass


def _expand_entry(entry: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    proxy = entry.get("proxy_url")
    rest = expand_env({k: v for k, v in entry.items() if k != "proxy_url"}, env, ())
    if isinstance(proxy, str):
        rest["proxy_url"] = _expand_proxy_url(proxy, env)
    elif "proxy_url" in entry:
        rest["proxy_url"] = proxy
    return rest


def _expand_proxy_url(raw: str, env: Mapping[str, str]) -> str:
    """Expand `${VAR}`s in a proxy URL, refusing credentials written into the file itself.

    The password (or a lone token in the user part) must be exactly one `${VAR}` without a default;
    expanded credentials are percent-encoded so a password with `@`, `:` or `/` can't break the URL.
    """
    scheme, sep, remainder = raw.partition("://")
    authority, slash, tail = remainder.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not sep or not at:
        return str(expand_env(raw, env, ("proxy_url",)))
    user, colon, password = userinfo.partition(":")
    secret = password if colon else user
    ref = ENV_REF.fullmatch(secret)
    if ref is None or ref.group(2):
        what = "password" if colon else "credential in the user part"
        raise _LiteralSecret(
            f"the proxy {what} is written into the file; put it in an environment variable and write "
            f"`${{ENV_VAR}}` instead (e.g. http://user:${{PROXY_PASSWORD}}@host:port)"
        )

    def expand(part: str) -> str:
        return quote(str(expand_env(part, env, ("proxy_url",))), safe="")

    userinfo = f"{expand(user)}:{expand(password)}" if colon else expand(user)
    rest = str(expand_env(f"{host}{slash}{tail}", env, ("proxy_url",)))
    return f"{expand_env(scheme, env, ('proxy_url',))}://{userinfo}@{rest}"
