"""Leads: the same thing is one lead with one stable id, and unacceptable leads are refused with a reason."""

from __future__ import annotations

import hashlib

import pytest
from dagster import DynamicPartitionsDefinition

from investigations.intake.leads import (
    LEAD_KINDS,
    PARTITION_KEY_MAX,
    Lead,
    LeadError,
    lead_id,
    lead_id_of_partition,
    normalize_lead,
    partition_key_for,
)

# -- normalization ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "raw", "normalized"),
    [
        pytest.param("domain", "Example.COM.", "example.com", id="domain-case-and-trailing-dot"),
        pytest.param("domain", "  example.com  ", "example.com", id="domain-surrounding-space"),
        pytest.param("domain", "Bücher.example", "xn--bcher-kva.example", id="domain-idn-to-punycode"),
        pytest.param("username", "@Alice", "alice", id="username-at-and-case"),
        pytest.param("username", "Alice.Smith_99", "alice.smith_99", id="username-dots-underscores"),
        pytest.param("email", "Alice@Example.COM", "alice@example.com", id="email-lowercase"),
        pytest.param("email", "bob@Bücher.example", "bob@xn--bcher-kva.example", id="email-idn-domain"),
        pytest.param("url", "HTTP://Example.com:80/a?b=1#frag", "http://example.com/a?b=1", id="url-default-port-fragment"),
        pytest.param("url", "https://EXAMPLE.com", "https://example.com/", id="url-empty-path-becomes-slash"),
        pytest.param("url", "https://example.com:8443/x", "https://example.com:8443/x", id="url-keeps-other-port"),
        pytest.param("url", "http://[2606:4700:4700:0::1111]:8080/p", "http://[2606:4700:4700::1111]:8080/p",
                     id="url-ipv6-host-compressed"),
        pytest.param("org", "  Acme   Corp \n Ltd ", "Acme Corp Ltd", id="org-whitespace-collapsed"),
        pytest.param("ip", "2606:4700:4700:0000:0000:0000:0000:1111", "2606:4700:4700::1111", id="ipv6-compressed"),
        pytest.param("ip", " 8.8.8.8 ", "8.8.8.8", id="ipv4"),
    ],
)
def test_normalize_lead_gives_the_canonical_value(kind: str, raw: str, normalized: str) -> None:
    assert normalize_lead(kind, raw) == Lead(kind, normalized)


@pytest.mark.parametrize(
    ("kind", "one", "other"),
    [
        ("domain", "Example.COM.", "example.com"),
        ("username", "@Alice", "alice"),
        ("email", "Alice@Example.COM", "alice@example.com"),
        ("url", "HTTP://Example.com:80/#top", "http://example.com/"),
        ("org", "Acme  Corp", "ACME CORP"),
        ("ip", "2606:4700:4700:0:0:0:0:1111", "2606:4700:4700::1111"),
    ],
)
def test_two_spellings_of_one_thing_have_one_id(kind: str, one: str, other: str) -> None:
    assert normalize_lead(kind, one).id == normalize_lead(kind, other).id


def test_org_keeps_its_spelling_while_its_id_ignores_case() -> None:
    assert normalize_lead("org", "ACME Corp").value == "ACME Corp"


def test_different_kinds_with_the_same_value_have_different_ids() -> None:
    assert normalize_lead("username", "example.com").id != normalize_lead("domain", "example.com").id


# -- ids --------------------------------------------------------------------------------------------


def test_lead_id_is_pinned_for_a_known_lead() -> None:
    # The id is the dynamic partition key: if this changes, every stored partition is orphaned.
    assert lead_id("domain", "example.com") == "domain-05d504ff83cf98ff"


def test_lead_id_follows_the_documented_formula() -> None:
    expected = "domain-" + hashlib.sha256(b"domain\x00example.com").hexdigest()[:16]
    assert normalize_lead("domain", "Example.COM.").id == expected


def test_lead_as_dict_holds_kind_and_value() -> None:
    assert normalize_lead("username", "@Alice").as_dict() == {"kind": "username", "value": "alice"}


# -- rejections ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "raw", "reason"),
    [
        pytest.param("ip", "10.0.0.1", "points at a private address (10.0.0.1)", id="private-ipv4"),
        pytest.param("ip", "169.254.169.254", "points at a private address", id="link-local-metadata"),
        pytest.param("ip", "fd00::1", "points at a private address (fd00::1)", id="private-ipv6"),
        pytest.param("ip", "::1", "points at a private address (::1)", id="loopback-ipv6"),
        pytest.param("ip", "::ffff:10.0.0.1", "points at a private address (10.0.0.1)", id="ipv4-mapped-private"),
        pytest.param("ip", "127.1", "points at a private address (127.0.0.1)", id="loopback-shorthand"),
        pytest.param("ip", "not-an-ip", "is not an IP address", id="ip-garbage"),
        pytest.param("url", "http://127.1/", "points at a private address (127.0.0.1)", id="url-loopback-shorthand"),
        pytest.param("url", "http://2130706433/", "points at a private address (127.0.0.1)", id="url-integer-host"),
        pytest.param("url", "http://[::ffff:127.0.0.1]/", "points at a private address (127.0.0.1)",
                     id="url-ipv4-mapped-loopback"),
        pytest.param("url", "http://localhost:8080/", "points at a private address (localhost)", id="url-localhost"),
        pytest.param("url", "http://intranet/", "single-label host 'intranet'", id="url-single-label-host"),
        pytest.param("url", "http://user:pw@example.com/", "carries credentials", id="url-with-credentials"),
        pytest.param("url", "ftp://example.com/", "must start with http:// or https://", id="url-ftp-scheme"),
        pytest.param("url", "http://example.com:99999/", "has an invalid port", id="url-bad-port"),
        pytest.param("domain", "localhost", "is not a valid domain name", id="domain-localhost"),
        pytest.param("domain", "printer.local", "points at a private address (printer.local)", id="domain-local"),
        pytest.param("domain", "metadata.google.internal", "points at a private address", id="domain-internal"),
        pytest.param("domain", "intranet", "is not a valid domain name", id="domain-single-label"),
        pytest.param("domain", "127.0.0.1", "is an IP address; send it as an ip lead", id="domain-that-is-an-ip"),
        pytest.param("domain", "a..b", "is not a valid domain name", id="domain-empty-label"),
        pytest.param("email", "alice", "is not an email address", id="email-without-at"),
        pytest.param("email", "alice@localhost", "is not a valid domain name", id="email-private-domain"),
        pytest.param("phone", "555-0100", "unknown lead kind 'phone'", id="unknown-kind"),
        pytest.param("domain", "", "domain lead is empty", id="empty"),
        pytest.param("username", "   ", "username lead is empty", id="blank"),
        pytest.param("org", "x" * 2049, "longer than 2048 characters", id="too-long"),
        pytest.param("username", "al ice", "is not a username", id="username-space"),
        pytest.param("username", "al!ce", "is not a username", id="username-bad-char"),
        pytest.param("username", "a" * 65, "is not a username", id="username-too-long"),
    ],
)
def test_normalize_lead_refuses_with_a_reason(kind: str, raw: str, reason: str) -> None:
    with pytest.raises(LeadError) as raised:
        normalize_lead(kind, raw)
    assert reason in str(raised.value)


def test_a_non_string_value_is_refused() -> None:
    with pytest.raises(LeadError, match="must be a string"):
        normalize_lead("domain", 42)  # type: ignore[arg-type]


def test_every_kind_has_a_normalizer() -> None:
    samples = {"domain": "example.com", "username": "alice", "email": "a@example.com",
               "url": "https://example.com/", "org": "Acme", "ip": "8.8.8.8"}
    assert set(samples) == set(LEAD_KINDS)
    assert [normalize_lead(kind, value).kind for kind, value in samples.items()] == list(samples)


@pytest.mark.parametrize(("kind", "raw", "key"), [
    ("domain", "Example.COM.", "domain:example.com"),
    ("username", "@Robin", "username:robin"),
    ("email", "Robin@Example.com", "email:robin@example.com"),
    ("url", "https://example.com/a?b=1", "url:https://example.com/a?b=1"),
    ("org", "Acme   Holdings", "org:Acme Holdings"),
    ("ip", "2606:4700:0::1111", "ip:2606:4700::1111"),
])
def test_a_leads_partition_key_is_the_lead_as_investigators_type_it(kind: str, raw: str, key: str) -> None:
    lead = normalize_lead(kind, raw)
    assert lead.partition_key == key
    assert lead_id_of_partition(key) == lead.id


@pytest.mark.parametrize("raw", [
    "https://example.com/a,b",  # the UI's partition selection splits on commas
    "https://example.com/[x]",
    "https://example.com/a|b",
    "https://example.com/wait...",  # Dagster refuses `...` in a partition key
    "https://example.com/" + "x" * PARTITION_KEY_MAX,
])
def test_a_value_no_key_can_read_is_keyed_by_its_id(raw: str) -> None:
    lead = normalize_lead("url", raw)
    assert lead.partition_key == lead.id
    assert lead_id_of_partition(lead.partition_key) == lead.id


def test_every_readable_key_is_one_dagster_accepts() -> None:
    leads = [normalize_lead("org", "Acme, Inc."), normalize_lead("url", "https://example.com/x?q=a b"),
             normalize_lead("domain", "example.com")]
    keys = [lead.partition_key for lead in leads]
    assert keys[0] == leads[0].id and keys[1].startswith("url:") and keys[2] == "domain:example.com"
    DynamicPartitionsDefinition(name="leads").build_add_request(keys)  # raises on a key Dagster refuses


def test_an_org_key_keeps_its_spelling_and_maps_to_the_case_blind_id() -> None:
    assert lead_id_of_partition(partition_key_for("org", "ACME Holdings")) == normalize_lead("org", "acme holdings").id


def test_a_partition_key_that_is_an_id_maps_to_itself() -> None:
    assert lead_id_of_partition("domain-05d504ff83cf98ff") == "domain-05d504ff83cf98ff"
