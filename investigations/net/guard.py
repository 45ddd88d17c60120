"""Refuse targets that point inside the network the fleet runs in (SSRF guard).

Leads come from outside; a lead such as `http://169.254.169.254/` or `localhost` must never make the
fleet fetch an internal address. One rule decides, for the intake and the fetcher alike: a target
is public only when it is globally routable unicast, whatever form carries the address (an IPv4
address inside IPv6 as mapped, compatible, NAT64 or 6to4; Teredo; legacy IPv4 shorthand). The rule
does not trust `ipaddress.is_global` alone: on Python 3.11 it is True for multicast, NAT64, 6to4,
site-local and some special-purpose blocks, so the IANA special-purpose registries are listed here.

What configuration may open on a private network (a source's own origin, an operator's CIDR list)
is decided by `TargetAllowance`, which a lead or a redirect can never widen.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Names that resolve inside a network by convention, whatever DNS says, and the reserved
# top-level names (RFC 2606, 6761, 6762, 8375, 9476) that have no public answer. `.example` is
# left out: it cannot resolve anywhere either, and tests and docs use it for public-looking names.
_PRIVATE_SUFFIXES = (
    ".localhost", ".local", ".localdomain", ".internal", ".lan", ".home.arpa", ".intranet", ".corp",
    ".private", ".test", ".invalid", ".onion", ".alt",
)
_PRIVATE_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

# Blocks that are not public unicast, with what they are. IANA's IPv4 and IPv6 special-purpose
# registries plus multicast and the tunnelling prefixes; the few embedding an IPv4 address are
# unwrapped before this table is read (see `_embedded_ipv4`).
_V4_BLOCKS: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local, cloud metadata"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments, cloud metadata"),
    ("192.0.2.0/24", "documentation"),
    ("192.31.196.0/24", "AS112"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "6to4 relay"),
    ("192.168.0.0/16", "private"),
    ("192.175.48.0/24", "AS112"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
)
_V6_BLOCKS: tuple[tuple[str, str], ...] = (
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard"),
    ("2001::/32", "Teredo"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing"),
    ("fc00::/7", "unique local, cloud metadata"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)
# Most specific first, so a reason names the narrowest block (broadcast, not reserved).
_BLOCKS: tuple[tuple[IPNetwork, str], ...] = tuple(sorted(
    ((ipaddress.ip_network(net), label) for net, label in (*_V4_BLOCKS, *_V6_BLOCKS)),
    key=lambda block: -block[0].prefixlen,
))
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")
_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)
_DEFAULT_PORTS = {"http": 80, "https": 443}

Resolver = Callable[[str, int], list[str]]


class TargetRefused(Exception):
    """A target the guard refuses; the message says why and names no secret."""


def parse_ip(host: str) -> IPAddress | None:
    """The address if `host` is an IP literal (brackets and an IPv6 zone allowed), else None."""
    candidate = host.strip().strip("[]")
    try:
        return ipaddress.ip_address(candidate)
    except ValueError:
        pass
    # Resolvers also read legacy forms (`127.1`, `0177.0.0.1`, `0x7f.1`, a bare integer) as IPv4,
    # so anything inet_aton accepts is an address, whatever it looks like.
    if _LEGACY_IPV4.match(candidate):
        try:
            return ipaddress.ip_address(socket.inet_aton(candidate))
        except OSError:
            return None
    return None


def address_reason(ip: IPAddress) -> str | None:
    """Why `ip` is not a globally routable unicast address, or None when it is one.

    An IPv4 address carried inside IPv6 (mapped, NAT64, 6to4) is judged as itself; the other
    tunnelling forms (IPv4-compatible, Teredo, local-use NAT64) are refused outright: no source
    of the fleet is reached through them, and their embedded address can be chosen freely.
    """
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.IPv6Address(str(ip).split("%", 1)[0])
    inner = _embedded_ipv4(ip)
    if inner is not None:
        form, v4 = inner
        reason = address_reason(v4)
        return None if reason is None else f"{reason}, as {form} {ip}"
    for network, label in _BLOCKS:
        if ip.version == network.version and ip in network:
            return f"points at a private address ({ip}): {label}"
    # Belt and braces for blocks added to Python's own tables after the list above was written.
    if not ip.is_global or ip.is_multicast:
        return f"points at a private address ({ip})"
    return None


def _embedded_ipv4(ip: IPAddress) -> tuple[str, ipaddress.IPv4Address] | None:
    """(form, IPv4 address) for the IPv6 forms whose meaning is an IPv4 destination."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _SIX_TO_FOUR and ip.sixtofour is not None:
        return "6to4", ip.sixtofour
    return None


def private_reason(host: str) -> str | None:
    """Why `host` (a name or an address literal) is not a public target, or None when it is one.

    The check is on the literal host: a public name that resolves to a private address is caught
    where the fleet resolves it (`resolve_checked`), not here.
    """
    name = host.strip().rstrip(".").lower()
    if not name:
        return "has no host"
    ip = parse_ip(name)
    if ip is not None:
        return address_reason(ip)
    if name in _PRIVATE_NAMES or name.endswith(_PRIVATE_SUFFIXES):
        return f"points at a private address ({name})"
    if "." not in name:
        return f"points at a private address (single-label host {name!r})"
    return None


def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host` (TCP), in its order, without duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))


@dataclass(frozen=True)
class TargetAllowance:
    """What configuration opens on a private network: whole origins and operators' CIDR blocks.

    `origins` are (scheme, host, port) triples taken from a source's configured URL, so its own
    private service is reachable at that port only; `networks` are blocks an operator lists
    explicitly (`request.private_networks`). Nothing a lead or a redirect carries is ever added.
    """

    origins: frozenset[tuple[str, str, int]] = frozenset()
    networks: tuple[IPNetwork, ...] = ()
    # Hosts and ports of `origins`, for the connection layer, which sees host and port but not
    # the scheme: a configured private name may resolve privately at those ports.
    _host_ports: frozenset[tuple[str, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_host_ports", frozenset((h, p) for _, h, p in self.origins))

    @classmethod
    def build(cls, origins: Iterable[tuple[str, str, int]] = (), networks: Iterable[IPNetwork] = ()) -> TargetAllowance:
        """An allowance from origins as written (host case and IPv6 brackets normalized) and networks."""
        return cls(frozenset((s.lower(), h.lower().strip("[]"), p) for s, h, p in origins), tuple(networks))

    def allows_origin(self, url: str) -> bool:
        """True when `url`'s origin is one configuration named."""
        origin = url_origin(url)
        return origin is not None and origin in self.origins

    def allows_connection(self, host: str, port: int, ip: IPAddress) -> bool:
        """True when connecting to `ip` for `host:port` is allowed although `ip` is not public."""
        if (host.lower().strip("[]"), port) in self._host_ports:
            return True
        return any(ip.version == net.version and ip in net for net in self.networks)


NO_ALLOWANCE = TargetAllowance()


def url_origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, lower-cased host, port with the scheme's default filled in), or None if unparseable."""
    try:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    return scheme, host, port if port is not None else _DEFAULT_PORTS[scheme]


def url_reason(url: str, allowance: TargetAllowance = NO_ALLOWANCE) -> str | None:
    """Why `url` must not be fetched by its literal form, or None (its name's addresses are judged
    when the fleet resolves it). A configured origin passes; an allowed CIDR passes its literals."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return "has an invalid host or port"
    if parts.scheme not in _DEFAULT_PORTS:
        return f"uses scheme {parts.scheme!r}, not http or https"
    if allowance.allows_origin(url):
        return None
    reason = private_reason(host)
    ip = parse_ip(host)
    if reason is not None and ip is not None and any(
        ip.version == net.version and ip in net for net in allowance.networks
    ):
        return None
    return reason


def resolve_checked(
    host: str, port: int, *, allowance: TargetAllowance = NO_ALLOWANCE, resolve: Resolver = system_resolve
) -> list[str]:
    """Resolve `host` once and return its addresses, every one of them checked; raise TargetRefused
    if any is not public (a name with one private answer among public ones is a private target).

    The caller connects to one of the returned addresses and never resolves again, so a name that
    answers differently the next time (DNS rebinding) cannot change where the connection goes.
    """
    literal = parse_ip(host)
    if literal is not None:
        addresses = [str(literal).split("%", 1)[0]]
    else:
        try:
            addresses = resolve(host, port)
        except (OSError, UnicodeError) as exc:
            raise OSError(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise OSError(f"cannot resolve {host}: no addresses")
    for address in addresses:
        ip = ipaddress.ip_address(address)
        reason = address_reason(ip)
        if reason is not None and not allowance.allows_connection(host, port, ip):
            raise TargetRefused(reason if literal is not None else f"{host} resolves to {reason.removeprefix('points at ')}")
    return addresses
