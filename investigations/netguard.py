"""Refuse targets that point inside the network the fleet runs in (SSRF guard).

Leads come from outside; a lead such as `http://169.254.169.254/` or `localhost` must never make the
fleet fetch an internal address. Only configured source hosts (trusted config) may be private.
"""

from __future__ import annotations

import ipaddress

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
    # Legacy shorthand forms (`127.1`, a bare integer) still reach loopback through most resolvers.
    if candidate.isdigit() or (candidate.replace(".", "").isdigit() and candidate.count(".") < 3):
        try:
            import socket

            return ipaddress.ip_address(socket.inet_aton(candidate))
        except OSError:
            return None
    return None


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
