"""The webhook intake: where the case system hands the fleet new leads (`investigations intake`).

One delivery goes through, in order: a cap on its headers (431), a deadline for its body (408, so a
sender that stops halfway holds nothing open), a size cap (413) on the raw bytes, the Standard Webhooks
signature over those same bytes (401), JSON parsing (400), validation of the whole delivery (422),
and one state-store transaction (503 if the store fails). Only after that transaction commits does
the case system get its 202, so a 2xx always means "stored".

Validation is all-or-nothing: one bad lead rejects the delivery and nothing is stored, and the 422
lists every problem at once so the case system can fix the lot and resend. The store is idempotent by
(webhook id, lead id), so a redelivery answers 202 again with every lead under `duplicates`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from investigations.config import ConfigError, Settings
from investigations.fleet.metrics import fleet_registry, render
from investigations.intake.leads import Lead, LeadError, normalize_lead
from investigations.intake.webhooks import HEADER_ID, WebhookAuthError, WebhookVerifier
from investigations.net.redaction import install_log_redaction
from investigations.scheduling.priority import PriorityClass
from investigations.sources.specs import SourceCatalog, load_sources
from investigations.store.state import AcceptResult, StateStore

logger = logging.getLogger("investigations.intake.app")

DEFAULT_MAX_BODY_BYTES: Final = 1_000_000
DEFAULT_MAX_LEADS: Final = 1000
# A delivery's headers are a handful of short lines; 16 KiB is room for a proxy's additions too.
DEFAULT_MAX_HEADER_BYTES: Final = 16_384
# The whole body must arrive within this: a 1 MB body takes well under a second on any link a case
# system uses, and a sender that stalls mid-body must not hold a connection and a task forever.
DEFAULT_BODY_TIMEOUT_S: Final = 10.0
MAX_CASE_ID_CHARS: Final = 200  # the width of cases.case_id and inbox.case_id
MAX_WEBHOOK_ID_CHARS: Final = 200  # the width of inbox.webhook_id
_BODY_KEYS: Final = frozenset({"case_id", "leads", "sources", "priority"})
_LEAD_KEYS: Final = frozenset({"kind", "value"})

Problem = dict[str, Any]


@dataclass(frozen=True)
class Delivery:
    """A validated delivery: normalized leads (one per lead sent, in order) and where to collect them."""

    case_id: str
    leads: list[Lead]
    sources: list[str] | None
    priority_class: PriorityClass


class DeliveryError(ValueError):
    """A delivery that cannot be accepted; `problems` lists every reason, each pointing at its place."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(f"{len(problems)} problem(s) in the delivery")
        self.problems = problems


def parse_delivery(payload: Any, *, catalog: SourceCatalog, max_leads: int = DEFAULT_MAX_LEADS) -> Delivery:
    """Validate a decoded webhook body against the catalog; raise DeliveryError listing every problem.

    A lead problem is `{"index", "kind", "value", "reason"}` (kind and value as sent); a problem with
    the rest of the body is `{"field", "reason"}`. Pure, so the rules are testable without HTTP.
    """
    if not isinstance(payload, dict):
        raise DeliveryError([{"field": "(body)", "reason": "the body must be a JSON object"}])
    problems: list[Problem] = []
    for key in sorted(set(payload) - _BODY_KEYS):
        problems.append({"field": key, "reason": f"unknown key (expected {', '.join(sorted(_BODY_KEYS))})"})

    case_id = payload.get("case_id")
    if not isinstance(case_id, str):
        problems.append({"field": "case_id", "reason": "required, a string"})
    elif not case_id.strip() or len(case_id) > MAX_CASE_ID_CHARS:
        reason = f"must be 1 to {MAX_CASE_ID_CHARS} characters, not blank"
        problems.append({"field": "case_id", "reason": reason})

    priority_raw = payload.get("priority")
    priority = PriorityClass.INTERACTIVE
    if priority_raw is not None:
        try:
            priority = PriorityClass(priority_raw)
        except ValueError:
            allowed = ", ".join(p.value for p in PriorityClass)
            problems.append({"field": "priority", "reason": f"must be one of {allowed}"})

    sources, sources_ok = _parse_sources(payload.get("sources"), catalog, problems)
    leads = _parse_leads(payload.get("leads"), catalog, sources, sources_ok, max_leads, problems)

    if problems:
        raise DeliveryError(problems)
    assert isinstance(case_id, str)
    return Delivery(case_id=case_id, leads=leads, sources=sources, priority_class=priority)


def _parse_sources(
    raw: Any, catalog: SourceCatalog, problems: list[Problem]
) -> tuple[list[str] | None, bool]:
    """The requested sources (None: every source) and whether they are all valid."""
    if raw is None:
        return None, True
    if not isinstance(raw, list):
        problems.append({"field": "sources", "reason": "must be a list of source names"})
        return None, False
    if not raw:
        # The store reads an empty list as "every source"; a sender who wrote [] meant something else.
        problems.append({"field": "sources", "reason": "must name at least one source, or be left out"})
        return None, False
    known = set(catalog.names)
    ok = True
    for i, name in enumerate(raw):
        if not isinstance(name, str) or name not in known:
            reason = f"unknown source {name!r} (known: {', '.join(catalog.names)})"
            problems.append({"field": f"sources[{i}]", "reason": reason})
            ok = False
    return (list(dict.fromkeys(raw)) if ok else None), ok


def _parse_leads(
    raw: Any,
    catalog: SourceCatalog,
    sources: list[str] | None,
    sources_ok: bool,
    max_leads: int,
    problems: list[Problem],
) -> list[Lead]:
    if not isinstance(raw, list) or not raw:
        problems.append({"field": "leads", "reason": "required, a non-empty list of {kind, value} objects"})
        return []
    if len(raw) > max_leads:
        # Checked before any lead is looked at, so an oversized list costs no normalization work.
        problems.append({"field": "leads", "reason": f"at most {max_leads} leads per delivery, got {len(raw)}"})
        return []
    # Which kinds some wanted source takes. With unusable `sources` the check is skipped: the answer
    # depends on how the sender fixes them, and the sources problem is already reported.
    wanted = catalog.sources if sources is None else [catalog.get(name) for name in sources]
    takes = {kind for spec in wanted for kind in spec.lead_kinds}
    leads: list[Lead] = []
    for i, item in enumerate(raw):
        kind = item.get("kind") if isinstance(item, dict) else None
        value = item.get("value") if isinstance(item, dict) else None
        reason = _lead_problem(item)
        if reason is None:
            try:
                lead = normalize_lead(kind, value)  # type: ignore[arg-type] # it checks both and says what is wrong
            except LeadError as exc:
                reason = str(exc)
            else:
                if sources_ok and lead.kind not in takes:
                    where = "no requested source" if sources is not None else "no source"
                    reason = f"{where} takes {lead.kind} leads"
                else:
                    leads.append(lead)
        if reason is not None:
            problems.append({"index": i, "kind": kind, "value": value, "reason": reason})
    return leads


def _lead_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "must be an object {kind, value}"
    extra = sorted(set(item) - _LEAD_KEYS)
    if extra:
        return f"unknown keys {extra} (a lead has only kind and value)"
    if not isinstance(item.get("kind"), str) or not isinstance(item.get("value"), str):
        return "kind and value must both be strings"
    return None


def create_intake_app(  # noqa: C901 - its route handlers are nested in it, and count as its branches
    *,
    store: StateStore,
    catalog: SourceCatalog,
    secret: str | Sequence[str],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_leads: int = DEFAULT_MAX_LEADS,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    data_dir: Path | None = None,
) -> Starlette:
    """Build the intake ASGI app: `GET /healthz`, `POST /v1/leads` (see the module docstring) and
    `GET /metrics`, the fleet's counters, latency histogram and state gauges for Prometheus
    (`investigations.fleet.metrics`).

    The caller owns `store` and closes it; the app only borrows it. `secret` may be a list: a
    delivery signed with any of them is accepted (rotation). A bad secret (empty, or a `whsec_`
    value that is not base64) raises ValueError here, at startup, rather than per request.
    """
    verifier = WebhookVerifier(secret)  # registers the secrets for redaction, too
    install_log_redaction()
    registry = fleet_registry(store, catalog, data_dir=data_dir)

    async def metrics(request: Request) -> Response:
        try:
            body = await run_in_threadpool(render, registry)
        except SQLAlchemyError as exc:
            logger.warning("metrics: state store unreachable (%s)", type(exc).__name__)
            return _error(503, "state store unavailable")
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        try:
            await run_in_threadpool(_ping, store)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the store means "not ready"
            logger.warning("healthz: state store unreachable (%s)", type(exc).__name__)
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def post_leads(request: Request) -> Response:
        header_bytes = sum(len(name) + len(value) + 4 for name, value in request.headers.raw)
        if header_bytes > max_header_bytes:
            logger.warning("delivery rejected status=431 header_bytes=%d max_header_bytes=%d",
                           header_bytes, max_header_bytes)
            return _error(431, f"request headers larger than {max_header_bytes} bytes", close=True)
        claimed_id = request.headers.get(HEADER_ID, "")  # unverified until the signature checks out
        try:
            with anyio.fail_after(body_timeout_s):
                body = await _read_body(request, max_body_bytes)
        except ClientDisconnect:
            logger.info("delivery abandoned webhook_id=%r: the sender disconnected mid-body", claimed_id)
            return Response(status_code=400)  # nobody is left to read it
        except TimeoutError:
            logger.warning("delivery rejected webhook_id=%r status=408 body_timeout_s=%g", claimed_id, body_timeout_s)
            return _error(408, f"body not received within {body_timeout_s:g} s", close=True)
        if body is None:
            logger.warning(
                "delivery rejected webhook_id=%r status=413 max_body_bytes=%d", claimed_id, max_body_bytes
            )
            return _error(413, f"body larger than {max_body_bytes} bytes")

        try:
            verifier.verify(body, request.headers)
        except WebhookAuthError as exc:
            logger.warning("delivery rejected webhook_id=%r status=401 reason=%r", claimed_id, exc.reason)
            return _error(401, f"invalid signature: {exc.reason}")
        webhook_id = claimed_id

        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            logger.warning("delivery rejected webhook_id=%r status=400 reason='malformed JSON'", webhook_id)
            return _error(400, "body is not valid JSON")

        try:
            if len(webhook_id) > MAX_WEBHOOK_ID_CHARS:
                raise DeliveryError(
                    [{"field": HEADER_ID, "reason": f"longer than {MAX_WEBHOOK_ID_CHARS} characters"}]
                )
            delivery = parse_delivery(payload, catalog=catalog, max_leads=max_leads)
        except DeliveryError as exc:
            case_id = payload.get("case_id") if isinstance(payload, dict) else None
            logger.warning(
                "delivery rejected webhook_id=%r case_id=%r status=422 problems=%d",
                webhook_id, case_id, len(exc.problems),
            )
            return JSONResponse(
                {"error": f"delivery rejected: {len(exc.problems)} problem(s), nothing stored",
                 "problems": exc.problems},
                status_code=422,
            )

        try:
            result: AcceptResult = await run_in_threadpool(
                store.accept_leads,
                webhook_id=webhook_id,
                case_id=delivery.case_id,
                leads=delivery.leads,
                sources=delivery.sources,
                priority_class=delivery.priority_class.value,
            )
        except SQLAlchemyError as exc:
            # The exception's own text may carry SQL parameters (lead values); log only its type and
            # the driver's first line, which says what went wrong (locked, refused, ...).
            cause = str(getattr(exc, "orig", None) or "").splitlines()[:1]
            logger.error(
                "delivery failed webhook_id=%r case_id=%r status=503 error=%s cause=%r",
                webhook_id, delivery.case_id, type(exc).__name__, (cause[0][:200] if cause else ""),
            )
            return _error(503, "state store unavailable")

        logger.info(
            "delivery accepted webhook_id=%r case_id=%r status=202 leads=%d accepted=%d duplicates=%d",
            webhook_id, delivery.case_id, len(delivery.leads), len(result.accepted), len(result.duplicates),
        )
        return JSONResponse(
            {
                "webhook_id": webhook_id,
                "case_id": delivery.case_id,
                "accepted": result.accepted,
                "duplicates": result.duplicates,
                "leads": [
                    {"lead_id": lead.id, "kind": lead.kind, "value": lead.value} for lead in delivery.leads
                ],
            },
            status_code=202,
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    routes = [Route("/healthz", healthz, methods=["GET"]), Route("/v1/leads", post_leads, methods=["POST"]),
              Route("/metrics", metrics, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def serve(settings: Settings | None = None, host: str = "127.0.0.1", port: int | None = None) -> None:
    """Run the intake in the foreground until interrupted (`investigations intake`).

    Everything comes from `settings` (default: the environment): the store from `database_url`, the
    catalog from `sources_path`, the secret from INVESTIGATIONS_WEBHOOK_SECRET, the port from
    `intake_port` unless `port` is given. Without a secret it refuses to start: an intake that took
    unsigned leads would let anyone make the fleet fetch what they like.
    """
    settings = settings or Settings.from_env()
    if not settings.webhook_secrets:
        raise ConfigError(
            "INVESTIGATIONS_WEBHOOK_SECRET is not set; the intake needs the secret the case system signs "
            "its webhooks with (a 'whsec_<base64>' value or a plain passphrase)"
        )
    catalog = load_sources(settings.sources_path)
    store = StateStore.from_url(settings.database_url)
    try:
        try:
            app = create_intake_app(store=store, catalog=catalog, secret=settings.webhook_secrets,
                                    data_dir=settings.data_dir)
        except ValueError as exc:  # the message names the problem, never the secret
            raise ConfigError(f"INVESTIGATIONS_WEBHOOK_SECRET: {exc}") from None
        uvicorn.Server(server_config(app, host=host, port=port or settings.intake_port)).run()
    finally:
        store.close()


def _ping(store: StateStore) -> None:
    # A raw DBAPI connection skips the engine's `BEGIN IMMEDIATE` hook on SQLite, so a health probe
    # never queues for (or holds) the write lock that real deliveries need.
    conn = store.engine.raw_connection()
    try:
        cursor = conn.cursor()
        try:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        finally:
            cursor.close()
    finally:
        conn.close()


async def _read_body(request: Request, max_body_bytes: int) -> bytes | None:
    """The raw body, or None as soon as it is known to exceed `max_body_bytes` (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        return None
    chunks: list[bytes] = []
    size = 0
    # Counted while streaming too: a chunked body has no Content-Length, and one may lie.
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, message: str, *, close: bool = False) -> JSONResponse:
    # `close`: the rest of the request may still be on the wire; the connection cannot be reused.
    return JSONResponse({"error": message}, status_code=status, headers={"Connection": "close"} if close else None)


def server_config(app: Starlette, *, host: str, port: int,
                  max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES) -> uvicorn.Config:
    """The uvicorn settings the intake is served with (`serve`, and the tests' real listener).

    h11 is chosen explicitly because it bounds the header block it buffers: past twice the app's
    own cap the server answers 400 itself without buffering more, and up to it the app answers 431.
    """
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, http="h11",
        h11_max_incomplete_event_size=2 * max_header_bytes,
    )
