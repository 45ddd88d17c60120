"""Redaction by value: a registered secret is replaced wherever it stands, under whatever name."""

from __future__ import annotations

import logging

import pytest

from investigations.net.redaction import SecretRegistry, install_log_redaction, redact, redact_url, register_secret

KEY = "k3y-VAlue/with+chars"


@pytest.fixture
def registry() -> SecretRegistry:
    registry = SecretRegistry()
    registry.register(KEY)
    return registry


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"https://api.example/v1/{KEY}/lookup?q=x", "https://api.example/v1/***/lookup?q=x"),  # in the path
        (f"https://api.example/v1?appid={KEY}&q=x", "https://api.example/v1?appid=***&q=x"),  # an unknown name
        ("https://api.example/v1?appid=k3y-VAlue%2Fwith%2Bchars", "https://api.example/v1?appid=***"),  # encoded
        ("https://api.example/v1/k3y-VAlue/with%2Bchars/x", "https://api.example/v1/***/x"),  # path-encoded
        (f"ConnectError: {KEY} refused", "ConnectError: *** refused"),  # plain text, no url
        (f"X-Api-Key: {KEY}", "X-Api-Key: ***"),  # a header line
        ("https://u:pw@api.example/x?token=t&q=1", "https://api.example/x?token=***&q=1"),  # the url rules remain
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_redact_replaces_a_registered_value_wherever_it_stands(registry: SecretRegistry, text: str, expected: str) -> None:
    assert redact(text, registry=registry) == expected


def test_redact_url_replaces_a_registered_value_in_a_url(registry: SecretRegistry) -> None:
    assert redact_url(f"https://api.example/{KEY}?x={KEY}", registry=registry) == "https://api.example/***?x=***"


def test_a_value_shorter_than_six_characters_is_not_registered() -> None:
    registry = SecretRegistry()
    registry.register("json")
    assert (len(registry), redact("application/json", registry=registry)) == (0, "application/json")


def test_a_longer_secret_containing_a_shorter_one_is_replaced_whole() -> None:
    registry = SecretRegistry()
    registry.register("abcdef")
    registry.register("abcdef-123456")
    assert redact("x abcdef-123456 y", registry=registry) == "x *** y"


def test_every_log_record_of_the_process_is_redacted_message_and_traceback(caplog: pytest.LogCaptureFixture) -> None:
    canary = "canary-l0g-value-31d7"
    register_secret(canary)
    install_log_redaction()
    caplog.set_level(logging.INFO)
    logger = logging.getLogger("some.library.nobody.filters")
    logger.info("GET https://api.example/%s/lookup", canary)
    try:
        raise ValueError(f"bad answer for {canary}")
    except ValueError:
        logger.exception("failed")
    assert canary not in caplog.text
    assert "https://api.example/***/lookup" in caplog.text and "bad answer for ***" in caplog.text
