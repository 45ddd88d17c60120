"""The identities file: validation with the file, identity and key named; credentials only from the
environment and never shown; the direct identity when there is no file; fingerprint header order."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from investigations.identities import load_identities, parse_identities
from investigations.identities.config import DIRECT_CATALOG, IdentityError

ROOT = Path(__file__).resolve().parents[3]
ENV = {"PROXY_DC1_PASSWORD": "s3cr3t", "PROXY_DC2_PASSWORD": "other", "PROXY_RES_PASSWORD": "res-pass"}

GOOD = """
tiers: [datacenter, residential]
fingerprints:
  chrome:
    user_agent: "Mozilla/5.0 Chrome"
    accept_language: "en-US,en;q=0.9"
    headers: [[User-Agent, ""], [Accept, "text/html"], [Accept-Language, ""], [Sec-Fetch-Mode, navigate]]
defaults: {tier: datacenter, fingerprint: chrome}
identities:
  - id: dc1_a
    proxy_url: "http://fleet:${PROXY_DC1_PASSWORD}@dc1.example.net:8001"
    range: dc1
    cost_per_mb_usd: 0.0005
  - id: res_a
    proxy_url: "http://fleet:${PROXY_RES_PASSWORD}@gate.example.com:7000"
    range: gate
    tier: residential
    cost_per_request_usd: 0.001
"""


def parse(text: str, env: dict[str, str] | None = None):
    return parse_identities(text, origin="ids.yaml", env=ENV if env is None else env)


def one(entry: str, tiers: str = "[datacenter]") -> str:
    return f"tiers: {tiers}\nidentities:\n  - {entry}\n"


def test_a_valid_file_gives_identities_in_file_order_with_defaults_applied() -> None:
    catalog = parse(GOOD)
    assert catalog.tiers == ("datacenter", "residential")
    assert [(i.id, i.range, i.tier) for i in catalog.identities] == [("dc1_a", "dc1", "datacenter"),
                                                                       ("res_a", "gate", "residential")]
    assert catalog.get("dc1_a").fingerprint.user_agent == "Mozilla/5.0 Chrome"
    assert catalog.tier_rank("residential") == 1


def test_the_proxy_password_comes_from_the_environment() -> None:
    assert parse(GOOD).get("dc1_a").proxy() == "http://fleet:s3cr3t@dc1.example.net:8001"


def test_an_expanded_password_is_percent_encoded_so_it_cannot_break_the_url() -> None:
    catalog = parse(GOOD, env={**ENV, "PROXY_DC1_PASSWORD": "p@ss/w:rd"})
    proxy = catalog.get("dc1_a").proxy()
    assert proxy == "http://fleet:p%40ss%2Fw%3Ard@dc1.example.net:8001"
    assert httpx.URL(proxy).host == "dc1.example.net"


def test_no_repr_or_redacted_url_shows_the_password() -> None:
    identity = parse(GOOD).get("dc1_a")
    assert identity.redacted_proxy_url() == "http://fleet:***@dc1.example.net:8001"
    for shown in (repr(identity), str(identity), repr(parse(GOOD))):
        assert "s3cr3t" not in shown


def test_a_literal_password_is_an_error_that_says_to_use_an_env_var() -> None:
    with pytest.raises(IdentityError) as err:
        parse(one('{id: dc1_a, range: dc1, tier: datacenter, proxy_url: "http://fleet:hunter2@dc1.example.net:8001"}'))
    message = str(err.value)
    assert message.startswith("ids.yaml: identity 'dc1_a': key 'proxy_url':")
    assert "${ENV_VAR}" in message
    assert "hunter2" not in message


def test_a_literal_token_in_the_user_part_is_an_error() -> None:
    with pytest.raises(IdentityError, match=r"identity 'dc1_a': key 'proxy_url': .*credential"):
        parse(one('{id: dc1_a, range: dc1, tier: datacenter, proxy_url: "http://tok123@dc1.example.net:8001"}'))


def test_a_default_password_in_the_env_reference_counts_as_written_into_the_file() -> None:
    with pytest.raises(IdentityError, match=r"key 'proxy_url'"):
        parse(one('{id: dc1_a, range: dc1, tier: datacenter, '
                  'proxy_url: "http://fleet:${PW:-hunter2}@dc1.example.net:8001"}'))


def test_a_missing_environment_variable_names_the_identity_and_key() -> None:
    with pytest.raises(IdentityError, match=r"ids.yaml: identity 'dc1_a': key 'proxy_url': .*PROXY_DC1_PASSWORD"):
        parse(GOOD, env={"PROXY_RES_PASSWORD": "x"})


def test_a_proxy_without_credentials_is_fine() -> None:
    catalog = parse(one('{id: dc1_a, range: dc1, tier: datacenter, proxy_url: "http://10.0.0.5:3128"}'))
    assert catalog.get("dc1_a").redacted_proxy_url() == "http://10.0.0.5:3128"


@pytest.mark.parametrize(
    ("entry", "key", "fragment"),
    [
        ("{id: dc1_a, range: dc1, tier: datacenter, colour: red}", "colour", "unknown key"),
        ("{id: dc1_a, range: dc1, tier: datacenter, cost_per_mb_usd: -1}", "cost_per_mb_usd", "greater than or equal"),
        ("{id: DC1, range: dc1, tier: datacenter}", "id", "lower-case"),
        ("{id: dc1_a, tier: datacenter}", "range", "Field required"),
        ("{id: dc1_a, range: dc1, tier: datacenter, proxy_url: 'ftp://h:21'}", "proxy_url", "scheme"),
        ("{id: dc1_a, range: dc1, tier: satellite}", "tier", "not one of tiers"),
        ("{id: dc1_a, range: dc1, tier: datacenter, fingerprint: nope}", "fingerprint", "unknown profile"),
    ],
)
def test_a_bad_entry_names_the_identity_and_the_key(entry: str, key: str, fragment: str) -> None:
    with pytest.raises(IdentityError) as err:
        parse(one(entry))
    assert f"identity '{entry.split(',')[0].split(': ')[1]}': key '{key}'" in str(err.value)
    assert fragment in str(err.value)


def test_an_identity_declared_twice_is_an_error() -> None:
    text = "tiers: [datacenter]\nidentities:\n  - {id: a, range: r, tier: datacenter}\n  - {id: a, range: r, tier: datacenter}\n"
    with pytest.raises(IdentityError, match="'a' is declared twice"):
        parse(text)


def test_tiers_must_be_listed() -> None:
    with pytest.raises(IdentityError, match="tiers"):
        parse("identities:\n  - {id: a, range: r, tier: datacenter}\n")


def test_no_file_means_one_direct_identity() -> None:
    catalog = load_identities(None)
    assert catalog is DIRECT_CATALOG
    assert [(i.id, i.proxy()) for i in catalog.identities] == [("direct", None)]


def test_a_named_file_that_is_missing_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cannot read identities file"):
        load_identities(tmp_path / "nope.yaml")


def test_the_example_file_loads() -> None:
    catalog = load_identities(ROOT / "identities.example.yaml", env=ENV)
    assert {i.range for i in catalog.identities if i.tier == "datacenter"} == {"dc1", "dc2"}
    assert [i.id for i in catalog.identities if i.tier == "residential"] == ["res_a"]


def test_fingerprint_headers_keep_their_order_and_take_values_from_the_fields() -> None:
    headers = parse(GOOD).get("dc1_a").fingerprint.ordered_headers()
    assert headers == [
        ("User-Agent", "Mozilla/5.0 Chrome"),
        ("Accept", "text/html"),
        ("Accept-Language", "en-US,en;q=0.9"),
        ("Sec-Fetch-Mode", "navigate"),
        ("Accept-Encoding", "gzip, deflate"),
        ("Connection", "keep-alive"),
    ]


def test_httpx_sends_the_fingerprint_headers_in_the_profile_order() -> None:
    headers = parse(GOOD).get("dc1_a").fingerprint.ordered_headers()
    with httpx.Client(headers=headers) as client:
        sent = [name.decode() for name, _ in client.build_request("GET", "http://example.test/").headers.raw]
    assert sent == ["Host", *[name for name, _ in headers]]


def test_a_fingerprint_header_may_not_override_the_user_agent_field() -> None:
    text = one('{id: a, range: r, tier: datacenter, fingerprint: {user_agent: X, accept_language: en, '
               'headers: [[User-Agent, Y]]}}')
    with pytest.raises(IdentityError, match=r"identity 'a': key 'fingerprint.headers': .*user_agent"):
        parse(text)


def test_a_fingerprint_may_not_offer_an_encoding_httpx_cannot_decode() -> None:
    text = one('{id: a, range: r, tier: datacenter, fingerprint: {user_agent: X, accept_language: en, '
               'headers: [[Accept-Encoding, "gzip, compress"]]}}')
    with pytest.raises(IdentityError, match="compress"):
        parse(text)
