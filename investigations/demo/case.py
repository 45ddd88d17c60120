"""The demo case `make run` sends: a signed webhook with a handful of fictional leads."""

from __future__ import annotations

import hashlib
import json
import uuid

import httpx

from investigations.intake.webhooks import sign_headers

DEMO_CASE_ID = "case-demo-northwind"
DEMO_LEADS: list[dict[str, str]] = [
    {"kind": "domain", "value": "Northwind-Traders.example."},
    {"kind": "domain", "value": "contoso.example"},
    {"kind": "domain", "value": "fabrikam.example"},
    {"kind": "domain", "value": "example.com"},
    {"kind": "domain", "value": "example.org"},
    {"kind": "username", "value": "@robin_example"},
    {"kind": "username", "value": "night.owl"},
    {"kind": "username", "value": "contoso-ops"},
    {"kind": "username", "value": "fabrikam_pr"},
    {"kind": "username", "value": "example-user"},
]


def demo_body(case_id: str = DEMO_CASE_ID) -> dict[str, object]:
    return {"case_id": case_id, "leads": DEMO_LEADS, "priority": "interactive"}


def demo_webhook_id(case_id: str = DEMO_CASE_ID) -> str:
    """The webhook id the demo case is sent with: always the same for the same case and leads, so that
    sending it again is a redelivery, which the intake stores once (a fresh id would be a new delivery
    and queue every collection again)."""
    digest = hashlib.sha256(json.dumps(demo_body(case_id), sort_keys=True).encode()).hexdigest()
    return f"msg_demo_{digest[:24]}"


def send_case(intake_url: str, secret: str, body: dict[str, object], *, webhook_id: str | None = None,
              timeout_s: float = 10.0) -> httpx.Response:
    """POST a signed case to the intake, as the case system would. Without `webhook_id` the delivery
    gets a fresh id, so the intake takes it as a new one; a redelivery must pass the id it was sent with."""
    raw = json.dumps(body).encode()
    headers = sign_headers(secret, raw, webhook_id=webhook_id or f"msg_{uuid.uuid4().hex}")
    headers["content-type"] = "application/json"
    with httpx.Client(trust_env=False, timeout=timeout_s) as client:
        return client.post(f"{intake_url.rstrip('/')}/v1/leads", content=raw, headers=headers)
