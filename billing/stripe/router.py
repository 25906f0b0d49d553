"""Billing's HTTP surface: the Stripe webhook, as a router the gateway app includes.

``router`` serves ``POST /v1/billing/stripe/webhook``. Its service is built once from
``BillingSettings`` on first use; tests (or an app with its own settings) override the
``webhook_service`` dependency.
"""

from __future__ import annotations

from functools import lru_cache

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from billing.settings import BillingSettings
from billing.stripe.webhooks import WebhookService, WebhookSignatureInvalid, verify

router = APIRouter(tags=["billing"])


@lru_cache(maxsize=1)
def webhook_service() -> WebhookService:
    return WebhookService(BillingSettings())


def _error(status: int, message: str, code: str) -> JSONResponse:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }
    return JSONResponse(status_code=status, content=body)


async def _read_at_most(request: Request, limit: int) -> bytes | None:
    """The body, or None once it is over ``limit`` bytes (declared or received)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@router.post("/v1/billing/stripe/webhook")
async def stripe_webhook(
    request: Request, service: WebhookService = Depends(webhook_service)
) -> JSONResponse:
    """Stripe's invoice events: payment failed suspends the org, paid lifts it."""
    secret = service.settings.stripe_webhook_secret
    if secret is None:
        return _error(
            503,
            "the Stripe webhook secret is not configured (CSTACK_STRIPE_WEBHOOK_SECRET)",
            "webhook_not_configured",
        )
    signature = request.headers.get("stripe-signature")
    if not signature:
        return _error(400, "missing Stripe-Signature header", "invalid_signature")
    limit = service.settings.stripe_webhook_max_bytes
    try:
        payload = await _read_at_most(request, limit)
    except ClientDisconnect:
        return _error(400, "client disconnected while sending the body", "invalid_event")
    if payload is None:
        return _error(413, f"webhook body exceeds {limit} bytes", "request_too_large")
    try:
        event = verify(payload, signature, secret.get_secret_value())
    except WebhookSignatureInvalid:
        return _error(400, "invalid Stripe-Signature for this payload", "invalid_signature")
    if not event.get("id") or not event.get("type"):
        return _error(400, "the webhook payload is not a Stripe event", "invalid_event")
    outcome = await service.handle(event)
    return JSONResponse({"received": True, "id": outcome.event_id, "duplicate": outcome.duplicate})
