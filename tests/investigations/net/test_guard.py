"""The SSRF guard: every form of a non-public address is refused, public ones pass."""

from __future__ import annotations

import ipaddress

import pytest

from investigations.intake.leads import LeadError, normalize_lead
from investigations.net.guard import (
    TargetAllowance,
    TargetRefused,
    address_reason,
    parse_ip,
    private_reason,
    resolve_checked,
    url_reason,
)


@pytest.mark.parametrize(
    "host",
    [
        "example.com",
        "Example.COM.",
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "[2606:4700:4700::1111]",
        "2001:4860:4860::8888",
        "::ffff:8.8.8.8",  # IPv4-mapped form of a public address
        "64:ff9b::808:808",  # NAT64 form of a public address
        "2002:808:808::1",  # 6to4 form of a public address
        "134744072",  # 8.8.8.8 as one integer
    ],
)
def test_public_hosts_have_no_reason(host: str) -> None:
    assert private_reason(host) is None


# (host, what the reason must mention): every form that must be refused, with why.
REFUSED = [
    # IPv4 special-purpose blocks
    ("0.0.0.0", "(0.0.0.0): this network"),
    ("0.1.2.3", "this network"),
    ("10.1.2.3", "(10.1.2.3): private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.0.1", "private"),
    ("127.0.0.1", "(127.0.0.1): loopback"),
    ("127.255.255.254", "loopback"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.100.100.200", "carrier-grade NAT"),  # Alibaba Cloud metadata
    ("169.254.169.254", "cloud metadata"),  # AWS, GCP, Azure metadata
    ("169.254.0.1", "link-local"),
    ("192.0.0.192", "cloud metadata"),  # Oracle Cloud metadata
    ("192.0.2.10", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.1", "benchmarking"),
    ("192.88.99.1", "6to4 relay"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "broadcast"),
    # legacy IPv4 spellings resolvers accept
    ("127.1", "(127.0.0.1): loopback"),
    ("2130706433", "(127.0.0.1): loopback"),
    ("0177.0.0.1", "(127.0.0.1): loopback"),
    ("0x7f.0.0.1", "(127.0.0.1): loopback"),
    ("0x7f.1", "(127.0.0.1): loopback"),
    ("0xa9fea9fe", "169.254.169.254"),
    ("10.1", "(10.0.0.1): private"),
    # IPv6 special-purpose blocks
    ("::", "unspecified"),
    ("::1", "(::1): loopback"),
    ("[::1]", "(::1): loopback"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("fd12:3456::1", "unique local"),
    ("fd00:ec2::254", "cloud metadata"),  # AWS IPv6 metadata
    ("fec0::1", "site-local"),
    ("ff02::1", "multicast"),
    ("ff05::2", "multicast"),
    ("2001:db8::1", "documentation"),
    ("3fff::1", "documentation"),
    ("100::1", "discard"),
    ("2001:10::1", "IETF protocol assignments"),
    ("64:ff9b:1::a00:1", "local-use NAT64"),
    # IPv4 carried in IPv6
    ("::ffff:192.168.1.1", "(192.168.1.1): private, as IPv4-mapped"),
    ("::ffff:127.0.0.1", "loopback, as IPv4-mapped"),
    ("::ffff:169.254.169.254", "cloud metadata, as IPv4-mapped"),
    ("[::ffff:7f00:1]", "loopback, as IPv4-mapped"),
    ("64:ff9b::7f00:1", "(127.0.0.1): loopback, as NAT64"),
    ("64:ff9b::a9fe:a9fe", "(169.254.169.254): link-local, cloud metadata, as NAT64"),
    ("64:ff9b::10.0.0.1", "private, as NAT64"),
    ("2002:7f00:1::", "loopback, as 6to4"),
    ("2002:a9fe:a9fe::1", "cloud metadata, as 6to4"),
    ("2002:c0a8:101::1", "private, as 6to4"),
    ("::127.0.0.1", "IPv4-compatible"),
    ("::10.0.0.1", "IPv4-compatible"),
    ("::8.8.8.8", "IPv4-compatible"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ("2001::1", "Teredo"),
    # internal names
    ("localhost", "localhost"),
    ("LOCALHOST.", "localhost"),
    ("ip6-localhost", "ip6-localhost"),
    ("app.localhost", "app.localhost"),
    ("printer.local", "printer.local"),
    ("metadata.google.internal", "metadata.google.internal"),
    ("router.home.arpa", "router.home.arpa"),
    ("nas.lan", "nas.lan"),
    ("box.localdomain", "box.localdomain"),
    ("service.test", "service.test"),
    ("intranet", "single-label host 'intranet'"),
    ("metadata", "single-label host 'metadata'"),
]


@pytest.mark.parametrize(("host", "mention"), REFUSED)
def test_every_non_public_form_is_refused_with_its_reason(host: str, mention: str) -> None:
    reason = private_reason(host)
    assert reason is not None and reason.startswith("points at a private address (")
    assert mention in reason


def test_the_table_covers_at_least_forty_forms() -> None:
    assert len(REFUSED) >= 40


@pytest.mark.parametrize("host", ["", "  "])
def test_an_empty_host_is_refused(host: str) -> None:
    assert private_reason(host) == "has no host"


@pytest.mark.parametrize("address", ["224.0.0.1", "ff02::1", "64:ff9b::a00:1", "2002:a00:1::1", "fec0::1"])
def test_forms_python_calls_global_are_still_refused(address: str) -> None:
    # ipaddress.is_global is True for these on Python 3.11: the guard must not rely on it.
    assert address_reason(ipaddress.ip_address(address)) is not None


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


def test_a_url_lead_at_octal_loopback_is_refused() -> None:
    with pytest.raises(LeadError, match="private address"):
        normalize_lead("url", "http://0177.0.0.1/")


@pytest.mark.parametrize("value", ["http://[64:ff9b::7f00:1]/", "http://[2002:a9fe:a9fe::]/", "http://[ff02::1]/"])
def test_a_url_lead_in_a_tunnelled_form_is_refused(value: str) -> None:
    with pytest.raises(LeadError, match="private address"):
        normalize_lead("url", value)


SANDBOX = TargetAllowance.build(origins=[("http", "127.0.0.1", 8800)])


@pytest.mark.parametrize(
    ("url", "allowance", "refused"),
    [
        ("http://127.0.0.1:8800/robust", SANDBOX, False),  # the configured origin
        ("http://127.0.0.1:8801/admin", SANDBOX, True),  # another port of the same host
        ("https://127.0.0.1:8800/", SANDBOX, True),  # another scheme
        ("http://localhost:8800/", SANDBOX, True),  # another name for the same host
        ("http://127.0.0.1/", SANDBOX, True),  # the default port is another port
        ("http://10.20.0.5:9000/", TargetAllowance.build(networks=[ipaddress.ip_network("10.20.0.0/16")]), False),
        ("http://10.21.0.5:9000/", TargetAllowance.build(networks=[ipaddress.ip_network("10.20.0.0/16")]), True),
        ("ftp://example.com/", SANDBOX, True),
        ("http://example.com:99999/", SANDBOX, True),
        ("https://example.com/", SANDBOX, False),
    ],
)
def test_url_reason_allows_configured_origins_and_networks_only(
    url: str, allowance: TargetAllowance, refused: bool
) -> None:
    assert (url_reason(url, allowance) is not None) is refused


def test_resolve_checked_refuses_a_name_with_one_private_answer_among_public_ones() -> None:
    with pytest.raises(TargetRefused, match=r"mixed.example resolves to a private address \(127\.0\.0\.1\): loopback"):
        resolve_checked("mixed.example", 80, resolve=lambda host, port: ["8.8.8.8", "127.0.0.1"])


def test_resolve_checked_returns_the_addresses_it_checked() -> None:
    assert resolve_checked("ok.example", 80, resolve=lambda host, port: ["8.8.8.8", "1.1.1.1"]) == ["8.8.8.8", "1.1.1.1"]


def test_resolve_checked_lets_a_configured_origin_resolve_privately_at_its_port_only() -> None:
    allowance = TargetAllowance.build(origins=[("http", "sandbox.example", 8800)])
    private = lambda host, port: ["10.0.0.7"]  # noqa: E731
    assert resolve_checked("sandbox.example", 8800, allowance=allowance, resolve=private) == ["10.0.0.7"]
    with pytest.raises(TargetRefused):
        resolve_checked("sandbox.example", 22, allowance=allowance, resolve=private)
