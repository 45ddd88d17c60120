"""Standard Webhooks signing and verification: only WebhookAuthError ever comes out of verify."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone

import pytest

from investigations.intake.webhooks import WebhookAuthError, WebhookVerifier, parse_secrets, secret_key, sign_headers

SECRET = "whsec_" + base64.b64encode(b"test-secret-key-0123456789abcdef").decode()
BODY = b'{"case_id": "case-1", "leads": [{"kind": "domain", "value": "example.com"}]}'


def signed(body: bytes = BODY, secret: str = SECRET, **kwargs: object) -> dict[str, str]:
    return sign_headers(secret, body, **kwargs)  # type: ignore[arg-type]


def test_signed_body_verifies() -> None:
    WebhookVerifier(SECRET).verify(BODY, signed())


def test_header_names_match_case_insensitively() -> None:
    headers = {name.title(): value for name, value in signed().items()}
    WebhookVerifier(SECRET).verify(BODY, headers)


def test_sign_headers_uses_the_given_id_and_timestamp() -> None:
    when = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    headers = signed(webhook_id="msg_fixed", timestamp=when)
    assert headers["webhook-id"] == "msg_fixed"
    assert headers["webhook-timestamp"] == str(int(when.timestamp()))
    assert headers["webhook-signature"].startswith("v1,")


def test_an_aware_timestamp_in_another_zone_signs_the_same_instant() -> None:
    when = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    elsewhere = when.astimezone(timezone(timedelta(hours=5)))
    assert signed(webhook_id="m", timestamp=elsewhere) == signed(webhook_id="m", timestamp=when)


def test_a_raw_secret_is_the_same_key_as_its_base64_whsec_form() -> None:
    raw = "correct horse battery staple"
    whsec = "whsec_" + base64.b64encode(raw.encode()).decode()
    WebhookVerifier(whsec).verify(BODY, signed(secret=raw))
    assert secret_key(raw) == secret_key(whsec)


def test_tampered_body_fails() -> None:
    with pytest.raises(WebhookAuthError, match="no matching signature"):
        WebhookVerifier(SECRET).verify(BODY.replace(b"example.com", b"example.org"), signed())


def test_another_secret_fails() -> None:
    with pytest.raises(WebhookAuthError, match="no matching signature"):
        WebhookVerifier(SECRET).verify(BODY, signed(secret="some other secret"))


def test_stale_timestamp_fails() -> None:
    old = datetime.now(UTC) - timedelta(minutes=10)
    with pytest.raises(WebhookAuthError, match="too old"):
        WebhookVerifier(SECRET).verify(BODY, signed(timestamp=old))


def test_future_timestamp_fails() -> None:
    future = datetime.now(UTC) + timedelta(minutes=10)
    with pytest.raises(WebhookAuthError, match="too new"):
        WebhookVerifier(SECRET).verify(BODY, signed(timestamp=future))


def test_one_matching_signature_among_several_passes() -> None:
    headers = signed()
    headers["webhook-signature"] = "v2,abc " + headers["webhook-signature"]
    WebhookVerifier(SECRET).verify(BODY, headers)


def _with(**changes: str | None) -> dict[str, str]:
    headers = signed()
    for name, value in changes.items():
        key = name.replace("_", "-")
        if value is None:
            headers.pop(key)
        else:
            headers[key] = value
    return headers


class _BrokenHeaders(Mapping[str, str]):
    """A mapping that fails when read, standing in for any odd object a caller might pass."""

    def __getitem__(self, key: str) -> str:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 3


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        pytest.param(BODY, {}, id="no headers"),
        pytest.param(BODY, _with(webhook_id=None), id="no id"),
        pytest.param(BODY, _with(webhook_timestamp=None), id="no timestamp"),
        pytest.param(BODY, _with(webhook_signature=None), id="no signature"),
        pytest.param(BODY, _with(webhook_id=""), id="empty id"),
        pytest.param(BODY, _with(webhook_signature=""), id="empty signature"),
        pytest.param(BODY, _with(webhook_signature="v1,!!!notbase64"), id="signature not base64"),
        pytest.param(BODY, _with(webhook_signature="v1"), id="signature without comma"),
        pytest.param(BODY, _with(webhook_signature="v1,a,b"), id="signature with two commas"),
        pytest.param(BODY, _with(webhook_signature="v1,"), id="signature empty after comma"),
        pytest.param(BODY, _with(webhook_signature="  "), id="signature blank"),
        pytest.param(BODY, _with(webhook_signature="v2,abc"), id="signature other version only"),
        pytest.param(BODY, _with(webhook_timestamp="yesterday"), id="timestamp not a number"),
        pytest.param(BODY, _with(webhook_timestamp="nan"), id="timestamp nan"),
        pytest.param(BODY, _with(webhook_timestamp="inf"), id="timestamp inf"),
        pytest.param(BODY, _with(webhook_timestamp="1e400"), id="timestamp overflow"),
        pytest.param(BODY, _with(webhook_timestamp="9" * 400), id="timestamp huge integer"),
        pytest.param(BODY, _with(webhook_timestamp="-1"), id="timestamp negative"),
        pytest.param(b"\xff\xfe not utf-8", signed(), id="body not utf-8"),
        pytest.param(
            BODY, {"webhook-id": 1, "webhook-timestamp": 2, "webhook-signature": 3}, id="values not str"
        ),
        pytest.param(BODY, _BrokenHeaders(), id="mapping that raises"),
    ],
)
def test_every_malformed_input_raises_webhook_auth_error_only(
    body: bytes, headers: Mapping[str, str]
) -> None:
    with pytest.raises(WebhookAuthError) as info:
        WebhookVerifier(SECRET).verify(body, headers)
    assert type(info.value) is WebhookAuthError and info.value.reason


def test_missing_header_reason_names_the_header() -> None:
    with pytest.raises(WebhookAuthError, match="webhook-timestamp"):
        WebhookVerifier(SECRET).verify(BODY, _with(webhook_timestamp=None))


def test_the_secret_never_shows_in_repr_or_errors() -> None:
    raw = "hunter2-very-secret"
    verifier = WebhookVerifier(raw)
    assert raw not in repr(verifier)
    with pytest.raises(WebhookAuthError) as info:
        verifier.verify(BODY, signed(secret="wrong"))
    assert raw not in str(info.value) and raw not in repr(info.value)


@pytest.mark.parametrize("secret", ["", "whsec_", "whsec_!!!not-base64!!!"])
def test_an_unusable_secret_is_refused_without_echoing_it(secret: str) -> None:
    with pytest.raises(ValueError) as info:
        WebhookVerifier(secret)
    assert "!!!not-base64!!!" not in str(info.value)


OLD = "whsec_" + base64.b64encode(b"rotation-old-secret-0123456789").decode()
NEW = "whsec_" + base64.b64encode(b"rotation-new-secret-9876543210").decode()


@pytest.mark.parametrize(
    ("accepted", "signed_with"),
    [
        ([OLD, NEW], [OLD]),  # a sender not yet moved to the new secret
        ([OLD, NEW], [NEW]),  # a sender already moved
        ([OLD, NEW], [NEW, OLD]),  # a sender in rotation signs with both
        ([NEW], [NEW, OLD]),  # the old secret retired: a sender signing with both still passes
        ([NEW, OLD], [OLD]),  # the order of the accepted secrets does not matter
    ],
)
def test_during_rotation_a_delivery_signed_with_any_accepted_secret_passes(
    accepted: list[str], signed_with: list[str]
) -> None:
    WebhookVerifier(accepted).verify(BODY, sign_headers(signed_with, BODY))


def test_after_rotation_the_retired_secret_no_longer_passes() -> None:
    with pytest.raises(WebhookAuthError, match="no matching signature"):
        WebhookVerifier([NEW]).verify(BODY, sign_headers(OLD, BODY))


def test_a_stale_timestamp_is_refused_whichever_secret_signed() -> None:
    old_time = datetime.now(UTC) - timedelta(minutes=10)
    with pytest.raises(WebhookAuthError, match="timestamp too old"):
        WebhookVerifier([OLD, NEW]).verify(BODY, sign_headers(NEW, BODY, timestamp=old_time))


def test_signing_with_two_secrets_puts_two_signatures_in_the_header() -> None:
    header = sign_headers([NEW, OLD], BODY)["webhook-signature"]
    assert [entry.split(",")[0] for entry in header.split(" ")] == ["v1", "v1"]


def test_parse_secrets_reads_a_space_separated_list_in_order() -> None:
    assert parse_secrets(f"  {NEW}\n{OLD} {NEW} ") == [NEW, OLD]


def test_a_verifier_needs_at_least_one_secret() -> None:
    with pytest.raises(ValueError, match="at least one"):
        WebhookVerifier([])


def test_the_repr_of_a_rotating_verifier_names_no_secret() -> None:
    text = repr(WebhookVerifier([OLD, NEW]))
    assert OLD not in text and NEW not in text and "rotation" not in text
