"""The SSRF guard: a lead's host that points inside the fleet's network is refused, public ones pass."""

from __future__ import annotations

import ipaddress

import pytest

from investigations.leads import LeadError, normalize_lead
from investigations.netguard import parse_ip, private_reason


@pytest.mark.parametrize(
    "host",
    ["example.com", "Example.COM.", "8.8.8.8", "2606:4700:4700::1111", "[2606:4700:4700::1111]", "::ffff:8.8.8.8"],
)
def test_public_hosts_have_no_reason(host: str) -> None:
    assert private_reason(host) is None


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("10.1.2.3", "points at a private address (10.1.2.3)"),
        ("192.168.0.1", "points at a private address (192.168.0.1)"),
        ("127.0.0.1", "points at a private address (127.0.0.1)"),
        ("0.0.0.0", "points at a private address (0.0.0.0)"),
        ("169.254.169.254", "points at a private address (169.254.169.254)"),
        ("100.64.0.1", "points at a private address (100.64.0.1)"),
        ("::1", "points at a private address (::1)"),
        ("[::1]", "points at a private address (::1)"),
        ("fe80::1", "points at a private address (fe80::1)"),
        ("fd12:3456::1", "points at a private address (fd12:3456::1)"),
        ("::ffff:192.168.1.1", "points at a private address (192.168.1.1)"),
        ("127.1", "points at a private address (127.0.0.1)"),
        ("2130706433", "points at a private address (127.0.0.1)"),
        ("localhost", "points at a private address (localhost)"),
        ("LOCALHOST.", "points at a private address (localhost)"),
        ("ip6-localhost", "points at a private address (ip6-localhost)"),
        ("app.localhost", "points at a private address (app.localhost)"),
        ("printer.local", "points at a private address (printer.local)"),
        ("db.internal", "points at a private address (db.internal)"),
        ("router.home.arpa", "points at a private address (router.home.arpa)"),
        ("nas.lan", "points at a private address (nas.lan)"),
        ("intranet", "points at a private address (single-label host 'intranet')"),
        ("", "has no host"),
        ("  ", "has no host"),
    ],
)
def test_private_hosts_have_a_reason(host: str, reason: str) -> None:
    assert private_reason(host) == reason


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("8.8.8.8", "8.8.8.8"),
        ("[2606:4700:4700::1111]", "2606:4700:4700::1111"),
        ("127.1", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("2130706433", "127.0.0.1"),
    ],
)
def test_parse_ip_reads_literals_and_legacy_shorthand(host: str, address: str) -> None:
    assert parse_ip(host) == ipaddress.ip_address(address)


@pytest.mark.parametrize("host", ["example.com", "1.2.3.4.5", "999.1.1.1", ""])
def test_parse_ip_is_none_for_names_and_impossible_addresses(host: str) -> None:
    assert parse_ip(host) is None


@pytest.mark.parametrize("host", ["0177.0.0.1", "0x7f.0.0.1", "0x7f.1"])
def test_octal_and_hex_loopback_forms_are_private(host: str) -> None:
    assert private_reason(host) == "points at a private address (127.0.0.1)"


def test_a_url_lead_at_octal_loopback_is_refused() -> None:
    with pytest.raises(LeadError, match="private address"):
        normalize_lead("url", "http://0177.0.0.1/")
