"""RDAP domain lookups, bootstrapped from IANA's registry of RDAP servers (RFC 9224, RFC 9083).

`request.url` is the bootstrap file (`https://data.iana.org/rdap/dns.json`): it maps top-level
domains to the base urls of their registries' RDAP servers. It is asked once per
`parse.bootstrap_ttl_s` (kept in the adapter's cache), then each lead is one request to its registry:
`<base>domain/<name>`. A registry's 404 is "no such domain" (declared in `answers:`); a top-level
domain the bootstrap does not list has no RDAP service, which is a permanent failure, not a result.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from pydantic import PositiveFloat

from investigations.adapters.base import (
    ParsedRecord,
    ParseError,
    ParseModel,
    PlannedRequest,
    TemplateAdapter,
    make_record,
    page_base,
)
from investigations.intake.leads import Lead

# Events that say something about the domain; "last update of RDAP database" changes on every
# answer and would make every crawl look like a change.
_EVENTS = {"registration": "registered_at", "expiration": "expires_at", "last changed": "changed_at",
           "transfer": "transferred_at"}

class RdapParse(ParseModel):
    """RDAP (RFC 9083) domain objects; `request.url` is IANA's bootstrap file (RFC 9224), which
    names each top-level domain's RDAP server and is cached `bootstrap_ttl_s`."""

    bootstrap_ttl_s: PositiveFloat = 86400.0



class RdapAdapter(TemplateAdapter):
    """Plans the bootstrap (when not cached) and the registry's domain lookup; parses the domain."""

    parse_model = RdapParse

    @property
    def config(self) -> RdapParse:
        return self.parse_config(RdapParse)

    def plan(self, lead: Lead) -> list[PlannedRequest]:
        """The registry lookup for a domain lead, after the bootstrap file when it is not cached.

        Raises ParseError when the cached bootstrap lists no RDAP server for the lead's TLD.
        """
        services = self.cache.get(f"rdap {self.spec.request.url}", ttl_s=self.config.bootstrap_ttl_s)
        if services is None:
            return [PlannedRequest("GET", self.spec.request.url, self.headers(), collects=False)]
        return [self._lookup(services, lead)]

    def follow(self, lead: Lead, request: PlannedRequest, body: bytes) -> list[PlannedRequest]:
        """After the bootstrap file: the lookup at the lead's registry (the file is then cached)."""
        if request.collects:
            return []
        services = parse_bootstrap(body)
        self.cache.put(f"rdap {self.spec.request.url}", services)
        return [self._lookup(services, lead)]

    def parse(self, body: bytes, *, url: str) -> list[ParsedRecord]:
        """The domain object as one record; ParseError when the answer is not an RDAP domain."""
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise ParseError(f"source {self.spec.name!r}: RDAP answer is not valid JSON ({exc})") from None
        if not isinstance(obj, dict) or obj.get("objectClassName") != "domain":
            found = obj.get("objectClassName") if isinstance(obj, dict) else type(obj).__name__
            raise ParseError(f"source {self.spec.name!r}: RDAP answer is not a domain object (found {found!r})")
        fields: dict[str, Any] = {
            "ldh_name": str(obj.get("ldhName") or "").lower() or None,
            "handle": obj.get("handle"),
            "status": sorted(s for s in obj.get("status") or [] if isinstance(s, str)),
            **{name: None for name in _EVENTS.values()},
            "registrar": None,
            "registrar_iana_id": None,
            "nameservers": sorted(str(ns.get("ldhName", "")).lower() for ns in obj.get("nameservers") or []
                                  if isinstance(ns, dict) and ns.get("ldhName")),
            "dnssec": (obj.get("secureDNS") or {}).get("delegationSigned"),
            "url": _self_link(obj),
        }
        for event in obj.get("events") or []:
            if isinstance(event, dict) and event.get("eventAction") in _EVENTS:
                fields[_EVENTS[event["eventAction"]]] = event.get("eventDate")
        for entity in obj.get("entities") or []:
            if isinstance(entity, dict) and "registrar" in (entity.get("roles") or []):
                fields["registrar"] = _vcard_name(entity)
                fields["registrar_iana_id"] = next(
                    (p.get("identifier") for p in entity.get("publicIds") or []
                     if isinstance(p, dict) and p.get("type") == "IANA Registrar ID"), None)
        key = fields["handle"] or fields["ldh_name"]
        return [make_record(fields, page_url=page_base(url), raw_key=key)]

    def _lookup(self, services: dict[str, str], lead: Lead) -> PlannedRequest:
        base = server_for(services, lead.value)
        if base is None:
            tld = lead.value.rsplit(".", 1)[-1]
            raise ParseError(f"source {self.spec.name!r}: IANA's bootstrap lists no RDAP service for .{tld}")
        url = f"{base}domain/{quote(lead.value, safe='')}"
        return PlannedRequest("GET", url, self.headers_for(url))


def parse_bootstrap(body: bytes) -> dict[str, str]:
    """IANA's bootstrap file as {label suffix: base url ending in '/'}, https preferred (RFC 9224 §5)."""
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise ParseError(f"RDAP bootstrap is not valid JSON ({exc})") from None
    services = document.get("services") if isinstance(document, dict) else None
    if not isinstance(services, list):
        raise ParseError("RDAP bootstrap has no services list")
    table: dict[str, str] = {}
    for service in services:
        if not (isinstance(service, list) and len(service) >= 2 and isinstance(service[0], list)
                and isinstance(service[1], list)):
            continue
        urls = [u for u in service[1] if isinstance(u, str) and u.startswith(("https://", "http://"))]
        if not urls:
            continue
        url = next((u for u in urls if u.startswith("https://")), urls[0])
        for suffix in service[0]:
            if isinstance(suffix, str) and suffix:
                table[suffix.lower()] = url if url.endswith("/") else url + "/"
    if not table:
        raise ParseError("RDAP bootstrap lists no service")
    return table


def server_for(services: dict[str, str], name: str) -> str | None:
    """The base url for `name`: its longest label suffix the bootstrap lists (`co.uk` before `uk`)."""
    labels = name.lower().rstrip(".").split(".")
    for start in range(len(labels)):
        if (url := services.get(".".join(labels[start:]))) is not None:
            return url
    return None


def _self_link(obj: dict[str, Any]) -> str | None:
    for link in obj.get("links") or []:
        if isinstance(link, dict) and link.get("rel") == "self" and isinstance(link.get("href"), str):
            return link["href"]
    return None


def _vcard_name(entity: dict[str, Any]) -> str | None:
    """The `fn` of an entity's jCard (RFC 7095): ["vcard", [["fn", {}, "text", "Name"], ...]]."""
    vcard = entity.get("vcardArray")
    if isinstance(vcard, list) and len(vcard) == 2 and isinstance(vcard[1], list):
        for prop in vcard[1]:
            if isinstance(prop, list) and len(prop) >= 4 and prop[0] == "fn":
                return str(prop[3])
    return None
