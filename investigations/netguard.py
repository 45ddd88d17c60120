"""Refuse targets that point inside the network the fleet runs in (SSRF guard).

Leads come from outside; a lead such as `http://169.254.169.254/` or `localhost` must never make the
fleet fetch an internal address. Only configured source hosts (trusted config) may be private.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from typing import Any

# Names that resolve inside a network by convention, whatever DNS says.
_PRIVATE_SUFFIXES = (".localhost", ".local", ".internal", ".lan", ".home.arpa", ".intranet", ".corp")
_PRIVATE_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def parse_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address if `host` is an IP literal (brackets allowed for IPv6), else None."""
    candidate = host.strip("[]")
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


_LEGACY_IPV4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$", re.IGNORECASE)


def private_reason(host: str) -> str | None:
    """Why `host` is not a public target, or None when it is one.

    The check is on the literal host: a public name that resolves to a private address is caught by
    the fetcher's own check at connect time, not here.
    """
    name = host.strip().rstrip(".").lower()
    if not name:
        return "has no host"
    ip = parse_ip(name)
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return None if ip.is_global else f"points at a private address ({ip})"
    if name in _PRIVATE_NAMES or name.endswith(_PRIVATE_SUFFIXES):
        return f"points at a private address ({name})"
    if "." not in name:
        return f"points at a private address (single-label host {name!r})"
    return None


def resolved_private_reason(
    host: str, *, resolve: Callable[..., list[Any]] = socket.getaddrinfo
) -> str | None:
    """Why a public-looking name is still not a public target: it resolves to a private address.

    A name that does not resolve is left to fail at connect time. (A resolver that answers
    differently at connect time can still slip past; pinning the address is future work.)
    """
    if parse_ip(host) is not None:
        return private_reason(host)
    try:
        infos = resolve(host, None)
    except (OSError, UnicodeError):
        return None
    for info in infos:
        address = info[4][0]
        if reason := private_reason(address.split("%", 1)[0]):
            return f"{host} resolves to an address that {reason.removeprefix('points at ')}"
    return None
