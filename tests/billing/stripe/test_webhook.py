"""The Stripe webhook router: signatures checked with stripe-python, events deduplicated,
``invoice.payment_failed`` suspends the org (admission refuses) and ``invoice.paid`` lifts it."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from billing.ledger import make_engine, migrate
from billing.ledger.writes import insert_usage_events
from billing.meter.protocol import AdmissionRefused
from billing.meter.redis_meter import RedisMeter
from billing.settings import BillingSettings
from billing.stripe.router import router, webhook_service
from billing.stripe.webhooks import WebhookService
from tests.support.builders import admission_request, ledger_event

pytestmark = pytest.mark.asyncio(loop_scope="session")
SECRET = "whsec_test_secret"
WEBHOOK = "/v1/billing/stripe/webhook"


def signed(payload: bytes, secret: str = SECRET) -> dict[str, str]:
    """Sign like Stripe does: HMAC-SHA256 over ``{t}.{payload}``."""
    timestamp = int(time.time())
    signature = hmac.new(secret.encode(), f"{timestamp}.".encode() + payload, hashlib.sha256)
    return {"stripe-signature": f"t={timestamp},v1={signature.hexdigest()}"}


async def deliver(http: httpx.AsyncClient, payload: bytes) -> httpx.Response:
    """POST a correctly signed delivery, as Stripe would."""
    return await http.post(WEBHOOK, content=payload, headers=signed(payload))


def invoice_event(
    event_id: str,
    kind: str,
    customer: str = "cus_hook",
    created: int | None = None,
    org: str | None = None,
) -> bytes:
    invoice: dict[str, object] = {"id": "in_1", "object": "invoice", "customer": customer}
    if org is not None:
        invoice["metadata"] = {"org_id": org}
    body: dict[str, object] = {
        "id": event_id,
        "object": "event",
        "type": kind,
        "data": {"object": invoice},
    }
    if created is not None:
        body["created"] = created
    return json.dumps(body).encode()


@pytest.fixture
async def client(billing_settings: BillingSettings) -> AsyncIterator[httpx.AsyncClient]:
    settings = billing_settings.model_copy(update={"stripe_webhook_secret": SecretStr(SECRET)})
    engine = make_engine(settings.ledger_url)
    migrate(engine)
    with engine.begin() as connection:  # the ledger knows cus_hook belongs to org-hook
        insert_usage_events(
            connection, [ledger_event("hook-1", org_id="org-hook", customer_id="cus_hook")]
        )
    app = FastAPI()
    app.include_router(router)
    service = WebhookService(settings)
    app.dependency_overrides[webhook_service] = lambda: service
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as http:
        yield http


async def test_forged_or_missing_signature_is_400(client: httpx.AsyncClient) -> None:
    payload = invoice_event("evt_forged", "invoice.payment_failed")
    forged = await client.post(WEBHOOK, content=payload, headers=signed(payload, "whsec_wrong"))
    assert forged.status_code == 400
    assert forged.json()["error"]["code"] == "invalid_signature"
    unsigned = await client.post(WEBHOOK, content=payload)
    assert unsigned.status_code == 400
    tampered = await client.post(
        WEBHOOK,
        content=payload.replace(b"cus_hook", b"cus_else"),
        headers=signed(payload),
    )
    assert tampered.status_code == 400


async def test_payment_failed_suspends_and_paid_lifts(
    client: httpx.AsyncClient, billing_settings: BillingSettings
) -> None:
    meter = RedisMeter(billing_settings)
    try:
        await meter.admit(admission_request(org="org-hook", customer="cus_hook"))
        failed = invoice_event("evt_failed_1", "invoice.payment_failed")
        response = await client.post(WEBHOOK, content=failed, headers=signed(failed))
        assert response.status_code == 200
        assert response.json() == {"received": True, "id": "evt_failed_1", "duplicate": False}
        with pytest.raises(AdmissionRefused, match="suspended") as refused:
            await meter.admit(admission_request(org="org-hook", customer="cus_hook"))
        assert refused.value.code == "insufficient_quota"

        again = await client.post(WEBHOOK, content=failed, headers=signed(failed))
        assert again.json()["duplicate"] is True

        paid = invoice_event("evt_paid_1", "invoice.paid")
        response = await client.post(WEBHOOK, content=paid, headers=signed(paid))
        assert response.status_code == 200
        await meter.admit(admission_request(org="org-hook", customer="cus_hook"))

        # A redelivered old failure does not suspend the org again.
        await deliver(client, failed)
        await meter.admit(admission_request(org="org-hook", customer="cus_hook"))
    finally:
        await meter.aclose()


async def test_events_apply_in_the_order_stripe_created_them(
    client: httpx.AsyncClient, billing_settings: BillingSettings
) -> None:
    """Stripe retries a failed delivery for days: a payment failure created before the
    payment that settled it must not suspend the org when it finally arrives."""
    meter = RedisMeter(billing_settings)
    order = {"customer": "cus_order", "org": "org-order"}
    request = admission_request(org="org-order", customer="cus_order")
    created = int(time.time()) - 3600
    try:
        paid = invoice_event("evt_order_paid", "invoice.paid", created=created + 60, **order)
        assert (await deliver(client, paid)).status_code == 200
        late = invoice_event(
            "evt_order_failed_late", "invoice.payment_failed", created=created, **order
        )
        answer = await deliver(client, late)
        assert answer.status_code == 200 and answer.json()["duplicate"] is False
        await meter.admit(request)  # still admitted: the failure is older than the payment

        newer = invoice_event(
            "evt_order_failed_new", "invoice.payment_failed", created=created + 120, **order
        )
        await deliver(client, newer)
        with pytest.raises(AdmissionRefused, match="suspended"):
            await meter.admit(request)
        older_paid = invoice_event(
            "evt_order_paid_old", "invoice.paid", created=created + 30, **order
        )
        await deliver(client, older_paid)
        with pytest.raises(AdmissionRefused, match="suspended"):
            await meter.admit(request)
    finally:
        await meter.aclose()


async def test_a_large_body_is_refused_before_it_is_read(client: httpx.AsyncClient) -> None:
    payload = b"{" + b" " * (300 * 1024) + b"}"
    response = await client.post(WEBHOOK, content=payload, headers=signed(payload))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


async def test_unconfigured_secret_is_a_clear_503(billing_settings: BillingSettings) -> None:
    app = FastAPI()
    app.include_router(router)
    service = WebhookService(billing_settings)
    app.dependency_overrides[webhook_service] = lambda: service
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://billing") as http:
        payload = invoice_event("evt_x", "invoice.paid")
        response = await http.post(WEBHOOK, content=payload, headers=signed(payload))
    assert response.status_code == 503
    assert "CSTACK_STRIPE_WEBHOOK_SECRET" in response.json()["error"]["message"]
