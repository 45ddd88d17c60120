"""Leads: what a case asks the fleet to look into, normalized so the same thing is one lead.

`Example.COM.` and `example.com` are one lead with one id. The id is a stable hash of the kind and
the normalized value: the state store, the record store and the evidence files are keyed by it, so
it must never change for a lead.

Its Dagster partition key is the lead as investigators type it, `domain:example.com`, so the UI's
partition filter finds a lead by its value (`partition_key_for`). A value that cannot be a readable
key (longer than PARTITION_KEY_MAX, or holding what Dagster or its UI's partition selection would
misread) keys its partition by its id instead. Either form maps back to the id without a look-up
(`lead_id_of_partition`). A lead registered before readable keys keeps the id as its key, and with
it its history in Dagster (the store records each lead's key: `leads.partition_key`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from investigations.net.guard import parse_ip, private_reason

LEAD_KINDS: Final = ("domain", "username", "email", "url", "org", "ip")

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_USERNAME = re.compile(r"^[a-z0-9._-]{1,64}$")
_MAX_VALUE_CHARS = 2048
# A readable partition key (`kind:value`) at most this long; a longer value is keyed by its id.
PARTITION_KEY_MAX = 200
# What a readable key may not hold: Dagster refuses `...` and control characters in a partition key,
# and the UI's partition selection reads `,` `[` `]` as separators and `|` as a multi-partition key.
_UNREADABLE_KEY = re.compile(r"[,\[\]|\x00-\x1f\x7f]|\.\.\.|^\s|\s$")


class LeadError(ValueError):
    """A lead that cannot be accepted; the message says why in words an investigator understands."""


@dataclass(frozen=True)
class Lead:
    kind: str
    value: str

    @property
    def id(self) -> str:
        return lead_id(self.kind, self.value)

    @property
    def partition_key(self) -> str:
        return partition_key_for(self.kind, self.value)

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "value": self.value}


def lead_id(kind: str, normalized_value: str) -> str:
    """Stable id of a normalized lead: the kind (readable in the UI) and 16 hex of a sha256."""
    key = normalized_value.casefold() if kind == "org" else normalized_value
    digest = hashlib.sha256(f"{kind}\x00{key}".encode()).hexdigest()
    return f"{kind}-{digest[:16]}"


def partition_key_for(kind: str, normalized_value: str) -> str:
    """The Dagster partition key of a lead registered now: `kind:value` as investigators type it, or
    its id when the value cannot be read as a key (see PARTITION_KEY_MAX and _UNREADABLE_KEY)."""
    key = f"{kind}:{normalized_value}"
    if len(key) > PARTITION_KEY_MAX or _UNREADABLE_KEY.search(normalized_value):
        return lead_id(kind, normalized_value)
    return key


def lead_id_of_partition(key: str) -> str:
    """The lead id a partition key stands for: `kind:value` hashed as `lead_id` does (no look-up and no
    re-normalizing: the key holds the normalized value), or the key itself when it is an id."""
    kind, colon, value = key.partition(":")
    if colon and kind in LEAD_KINDS:  # lead ids have no colon
        return lead_id(kind, value)
    return key


def normalize_lead(kind: str, value: str) -> Lead:
    """Validate and normalize one lead; raise LeadError with the reason when it cannot be accepted."""
    if kind not in LEAD_KINDS:
        raise LeadError(f"unknown lead kind {kind!r} (expected one of {', '.join(LEAD_KINDS)})")
    if not isinstance(value, str):
        raise LeadError(f"{kind} lead value must be a string")
    raw = value.strip()
    if not raw:
        raise LeadError(f"{kind} lead is empty")
    if len(raw) > _MAX_VALUE_CHARS:
        raise LeadError(f"{kind} lead is longer than {_MAX_VALUE_CHARS} characters")
    return Lead(kind, _NORMALIZERS[kind](raw))


def _domain(raw: str) -> str:
    name = raw.rstrip(".").lower()
    if parse_ip(name) is not None:
        raise LeadError(f"{raw!r} is an IP address; send it as an ip lead")
    try:
        name = name.encode("idna").decode("ascii")
    except UnicodeError:
        raise LeadError(f"{raw!r} is not a valid domain name") from None
    labels = name.split(".")
    if len(name) > 253 or len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        raise LeadError(f"{raw!r} is not a valid domain name")
    if reason := private_reason(name):
        raise LeadError(f"domain {raw!r} {reason}")
    return name


def _username(raw: str) -> str:
    name = raw.removeprefix("@").lower()
    if not _USERNAME.match(name):
        raise LeadError(f"{raw!r} is not a username (letters, digits, '.', '_' and '-', at most 64)")
    return name


def _email(raw: str) -> str:
    local, at, domain = raw.rpartition("@")
    if not at or not local or any(c.isspace() for c in local) or len(local) > 64:
        raise LeadError(f"{raw!r} is not an email address")
    return f"{local.lower()}@{_domain(domain)}"


def _url(raw: str) -> str:
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise LeadError(f"url {raw!r} must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise LeadError(f"url {raw!r} carries credentials; send the url without them")
    host = (parts.hostname or "").rstrip(".")
    if reason := private_reason(host):
        raise LeadError(f"url {raw!r} {reason}")
    ip = parse_ip(host)
    if ip is None:
        host = _domain(host)
    elif isinstance(ip, ipaddress.IPv6Address):
        host = f"[{ip.compressed}]"
    try:
        port = parts.port
    except ValueError:
        raise LeadError(f"url {raw!r} has an invalid port") from None
    default_port = {"http": 80, "https": 443}[scheme]
    netloc = host if port in (None, default_port) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def _org(raw: str) -> str:
    return " ".join(raw.split())


def _ip(raw: str) -> str:
    ip = parse_ip(raw)
    if ip is None:
        raise LeadError(f"{raw!r} is not an IP address")
    if reason := private_reason(raw):
        raise LeadError(f"ip {raw!r} {reason}")
    return ip.compressed


_NORMALIZERS = {
    "domain": _domain,
    "username": _username,
    "email": _email,
    "url": _url,
    "org": _org,
    "ip": _ip,
}


def lead_id_of(text: str) -> str:
    """A lead id as given, or the id of a lead given as kind:value (`domain:example.com`); raises
    LeadError when kind:value is no valid lead."""
    kind, colon, value = text.partition(":")
    if colon and kind in LEAD_KINDS:  # lead ids have no colon: this is kind:value
        return normalize_lead(kind, value).id
    return text
