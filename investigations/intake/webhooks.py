"""Standard Webhooks signatures for the lead intake: one verifier, one signer, one exception.

A thin wrapper around the `standardwebhooks` package. The package raises whatever its parsing hits
(`ValueError` on a signature without a comma, `binascii.Error` on bad base64, `UnicodeDecodeError`
on a non-UTF-8 body); this module turns every one of them into `WebhookAuthError`, so a malformed
header is a 401 at the intake and never a 500.

Secrets come in two forms, and both sides (sender and intake) read them the same way:
- `whsec_<base64>`: the Standard Webhooks form; the key is the base64-decoded bytes.
- anything else: a raw secret string; the key is its UTF-8 bytes, exactly as if it had been
  base64-encoded and given as `whsec_<base64(secret)>`. This lets an operator set
  `INVESTIGATIONS_WEBHOOK_SECRET` to a plain passphrase.
No message or repr of this module ever contains the secret.

Rotation: the verifier takes several secrets and accepts a delivery signed with any of them, and a
sender in rotation may sign with several at once (Standard Webhooks puts one `v1,<sig>` per secret,
space-separated, in `webhook-signature`). `parse_secrets` reads the environment's space-separated list.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from math import floor
from typing import Final

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from investigations.net.redaction import register_secret

SECRET_PREFIX: Final = "whsec_"
HEADER_ID: Final = "webhook-id"
HEADER_TIMESTAMP: Final = "webhook-timestamp"
HEADER_SIGNATURE: Final = "webhook-signature"
SIGNATURE_HEADERS: Final = (HEADER_ID, HEADER_TIMESTAMP, HEADER_SIGNATURE)

# The package's own messages, reworded as reasons the sender can act on. Fixed strings on purpose:
# a reason never echoes a header value back (nothing attacker-controlled is reflected).
_REASONS: Final = {
    "Missing required headers": "missing webhook headers",
    "Invalid Signature Headers": "malformed webhook-timestamp header",
    "Message timestamp too old": "timestamp too old",
    "Message timestamp too new": "timestamp too new",
    "No matching signature found": "no matching signature",
}


class WebhookAuthError(Exception):
    """A delivery whose signature cannot be trusted; `reason` says why without revealing the secret."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def secret_key(secret: str) -> bytes:
    """The HMAC key for `secret` (see the module docstring for the two accepted forms).

    Raises ValueError, naming the problem but never the secret, when it is empty or a `whsec_`
    secret whose remainder is not base64.
    """
    if not isinstance(secret, str) or not secret:
        raise ValueError("webhook secret must be a non-empty string")
    register_secret(secret)  # never written anywhere, in either form
    register_secret(secret.removeprefix(SECRET_PREFIX))
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode("utf-8")
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        # Strict decoding: the package itself silently skips non-alphabet characters, which would
        # turn a typo in the secret into a different key instead of an error at startup.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("webhook secret starts with 'whsec_' but the rest is not valid base64") from None
    if not key:
        raise ValueError("webhook secret 'whsec_...' decodes to an empty key")
    return key


def parse_secrets(value: str) -> list[str]:
    """The secrets in a space-separated list (`"whsec_new whsec_old"`), in order, without duplicates.

    Whitespace separates secrets, so a plain passphrase cannot contain any (its `whsec_` form can
    carry any bytes). The first secret is the one a sender of this fleet (the demo) signs with.
    """
    return list(dict.fromkeys(value.split()))


class WebhookVerifier:
    """Checks Standard Webhooks signatures against one or more secrets (rotation); thread-safe."""

    __slots__ = ("_webhooks",)

    def __init__(self, secrets: str | Sequence[str]) -> None:
        listed = [secrets] if isinstance(secrets, str) else list(secrets)
        if not listed:
            raise ValueError("at least one webhook secret is needed")
        self._webhooks = [Webhook(secret_key(secret)) for secret in listed]

    def __repr__(self) -> str:
        return f"WebhookVerifier(secrets=<{len(self._webhooks)} redacted>)"

    def verify(self, body: bytes, headers: Mapping[str, str]) -> None:
        """Verify the signature over the raw `body`; raise WebhookAuthError with the reason if not valid.

        Header names are matched case-insensitively. The timestamp must be within the package's
        tolerance (five minutes either way), which bounds how long a captured delivery can be replayed.
        A signature made with any of the verifier's secrets passes. Only WebhookAuthError ever
        leaves this method.
        """
        picked = _signature_headers(headers)
        missing = [name for name in SIGNATURE_HEADERS if not picked.get(name)]
        if missing:
            raise WebhookAuthError(f"missing header {', '.join(missing)}")
        reason = "no matching signature"
        for webhook in self._webhooks:
            try:
                webhook.verify(body, picked, json_parse=False)
                return
            except WebhookVerificationError as exc:
                reason = _REASONS.get(str(exc), "signature verification failed")
                if reason != "no matching signature":
                    break  # a stale timestamp or bad header is the same for every secret
            except Exception as exc:  # noqa: BLE001 - classified below, only WebhookAuthError leaves
                raise WebhookAuthError(_malformed_reason(exc)) from None
        raise WebhookAuthError(reason)


def _malformed_reason(exc: Exception) -> str:
    """Why the package could not even compare signatures, in the sender's terms."""
    if isinstance(exc, UnicodeDecodeError):
        # The package signs text; a body that is not UTF-8 cannot have been signed by it.
        return "body is not UTF-8 text"
    if isinstance(exc, ValueError):  # includes binascii.Error: an entry without ',' or with bad base64
        return "malformed webhook-signature header"
    return "signature verification failed"


def sign_headers(
    secret: str | Sequence[str], body: bytes, *, webhook_id: str | None = None,
    timestamp: datetime | None = None,
) -> dict[str, str]:
    """Standard Webhooks headers for sending `body` signed with `secret` (demo sender, tests, benches);
    given several secrets (a sender in rotation), one signature per secret, space-separated.

    `webhook_id` defaults to a fresh `msg_<uuid>`; `timestamp` defaults to now (a naive datetime is
    taken as UTC). Redelivering the same event must reuse its `webhook_id`: that id is what makes the
    intake idempotent.
    """
    webhooks = [Webhook(secret_key(one)) for one in ([secret] if isinstance(secret, str) else secret)]
    if not webhooks:
        raise ValueError("at least one webhook secret is needed")
    msg_id = webhook_id or f"msg_{uuid.uuid4().hex}"
    if timestamp is None:
        when = datetime.now(UTC)
    elif timestamp.tzinfo is None:
        when = timestamp.replace(tzinfo=UTC)
    else:
        # The package replaces the tzinfo instead of converting, so convert before handing it over.
        when = timestamp.astimezone(UTC)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("webhook body must be UTF-8 text to be signed") from None
    return {
        HEADER_ID: msg_id,
        HEADER_TIMESTAMP: str(floor(when.timestamp())),
        HEADER_SIGNATURE: " ".join(webhook.sign(msg_id, when, text) for webhook in webhooks),
    }


def _signature_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The three signature headers, by lower-cased name; everything else in `headers` is ignored."""
    picked: dict[str, str] = {}
    try:
        for name, value in headers.items():
            key = name.lower() if isinstance(name, str) else ""
            if key in SIGNATURE_HEADERS and isinstance(value, str):
                picked[key] = value
    except Exception:  # noqa: BLE001 - a broken mapping is a bad delivery, not a crash
        raise WebhookAuthError("unreadable webhook headers") from None
    return picked
