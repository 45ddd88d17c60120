"""One redaction for everything the fleet writes: secrets replaced by value, URLs by their shape.

Redacting by name (`api_key=`, `token=`) misses a key placed in a URL path or under a name nobody
listed (`appid=`). So every secret the fleet is given is registered here by value when it is
loaded (a source's `${VAR}` expansions, an identity's proxy password, the webhook secrets) and
`redact` replaces each, in its raw and percent-encoded forms, wherever it appears, before the
URL rules (no `user:password@`, secret-looking query values as `***`) run on every URL in the text.

The registry is per process, because what it protects is too: every log record the process creates
goes through `redact` once `install_log_redaction` has run (the fetcher runs it at import), whatever
logger made it (httpx's request lines included), traceback text included.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from urllib.parse import quote, quote_plus, unquote_plus, urlsplit, urlunsplit

MASK = "***"
# Shorter values are not secrets worth the name, and replacing them would garble every line written.
MIN_SECRET_CHARS = 6
_SECRET_NAME_PARTS = ("key", "token", "secret", "password", "passwd", "sig", "auth")
_URL_IN_TEXT = re.compile(r"https?://[^\s'\"<>]+")


class SecretRegistry:
    """Secret values to replace wherever they would be written; thread-safe, only ever grows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forms: tuple[str, ...] = ()  # every registered form, longest first
        self._pattern: re.Pattern[str] | None = None

    def register(self, value: str | None) -> None:
        """Remember `value` (and the forms it takes in a URL) as a secret; short values are ignored."""
        if not value or len(value) < MIN_SECRET_CHARS:
            return
        forms = {value, quote(value, safe=""), quote_plus(value), quote(value, safe="/:@")}
        with self._lock:
            merged = sorted(set(self._forms) | forms, key=len, reverse=True)
            if tuple(merged) != self._forms:
                self._forms = tuple(merged)
                self._pattern = re.compile("|".join(re.escape(form) for form in merged))

    def __len__(self) -> int:
        return len(self._forms)

    def replace(self, text: str) -> str:
        """`text` with every registered form replaced by `***`."""
        pattern = self._pattern
        return text if pattern is None else pattern.sub(MASK, text)


SECRETS = SecretRegistry()


def register_secret(value: str | None) -> None:
    """Register `value` with the process's registry (see the module docstring)."""
    SECRETS.register(value)


def redact_url(url: str, *, registry: SecretRegistry = SECRETS) -> str:
    """`url` safe to log or store: secrets by value, no user:password, secret-named query values `***`."""
    url = registry.replace(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable url)"
    netloc = parts.netloc.rpartition("@")[2]
    query = "&".join(_redact_param(piece) for piece in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact(text: str, *, registry: SecretRegistry = SECRETS) -> str:
    """`text` safe to log or store: secrets by value, and every URL in it as `redact_url` makes it."""
    text = registry.replace(text)
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group(), registry=registry), text)


def _redact_param(piece: str) -> str:
    name, eq, _ = piece.partition("=")
    lowered = unquote_plus(name).lower()
    if eq and any(part in lowered for part in _SECRET_NAME_PARTS):
        return f"{name}={MASK}"
    return piece


_installed = False
_install_lock = threading.Lock()


def install_log_redaction() -> None:
    """Make every log record of the process pass through `redact`: message and traceback text.

    Done in the record factory, not a logger's filter: a filter sees only its own logger's records,
    and a secret can reach any logger (httpx's request lines, a library's warning, a traceback).
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: object, **kwargs: object) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a broken format string is logging's to report, at emit time
        return
    redacted = redact(message)
    if redacted != message:
        record.msg, record.args = redacted, ()
    if record.exc_info and record.exc_info[1] is not None:
        # Formatters reuse exc_text when it is set, so the traceback is written as redacted here.
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        record.exc_text = redact(text)
