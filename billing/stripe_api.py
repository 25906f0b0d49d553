"""The Stripe calls billing makes, through stripe-python: invoice items and the upcoming invoice.

One place for the client's configuration and for the request shapes, so that the sync
(billing/stripe_sync.py) and `cstack billing reconcile` (billing/reconcile.py) read and
write Stripe the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import stripe

from billing.settings import BillingSettings

#: Metadata keys on every invoice item billing posts; reconcile attributes items by them.
ORG = "cstack_org"
PERIOD = "cstack_period"
LINE = "cstack_line"
REVISION = "cstack_revision"
#: Stripe's page size limit for list calls.
PAGE = 100


def stripe_client(settings: BillingSettings) -> stripe.StripeClient:
    if settings.stripe_api_key is None:
        raise RuntimeError("CSTACK_STRIPE_API_KEY is not set; cannot talk to Stripe")
    return stripe.StripeClient(
        settings.stripe_api_key.get_secret_value(),
        base_addresses={"api": settings.stripe_api_base.rstrip("/")},
        # Retries are ours (persisted, backed off); stripe-python's would hide failures.
        max_network_retries=0,
    )


@dataclass(frozen=True)
class StripeItem:
    """An invoice item as Stripe holds it (posted by us or anyone else)."""

    id: str
    amount_cents: int
    description: str
    metadata: dict[str, str]
    #: Start of the item's service period (Stripe defaults it to the creation time).
    period_start: int | None
    #: The invoice it is on; None while it is pending (the next invoice will take it).
    invoice: str | None


def create_invoice_item(
    client: stripe.StripeClient,
    *,
    customer: str,
    amount_cents: int,
    description: str,
    metadata: dict[str, str],
    service_period: tuple[datetime, datetime],
    idempotency_key: str,
) -> str:
    """Post one amount-only item (no quantity x unit price: Stripe would round that itself)."""
    start, end = service_period
    item = client.v1.invoice_items.create(
        params={
            "customer": customer,
            "amount": amount_cents,
            "currency": "usd",
            "description": description,
            "metadata": metadata,
            # The month the usage belongs to, shown on the invoice; the end is inclusive.
            "period": {
                "start": int(start.timestamp()),
                "end": int((end - timedelta(seconds=1)).timestamp()),
            },
        },
        options={"idempotency_key": idempotency_key},
    )
    return str(item.id)


def list_invoice_items(client: stripe.StripeClient, customer: str) -> list[StripeItem]:
    """Every invoice item of ``customer``, pending or invoiced, following Stripe's pages."""
    page = client.v1.invoice_items.list(params={"customer": customer, "limit": PAGE})
    items = []
    for item in page.auto_paging_iter():
        data = item.to_dict()  # plain values: fields Stripe left out read as None
        invoice = data.get("invoice")
        period = data.get("period")
        items.append(
            StripeItem(
                id=str(data["id"]),
                amount_cents=int(data["amount"]),
                description=str(data.get("description") or ""),
                metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
                period_start=int(period["start"]) if period else None,
                # Not expanded, Stripe sends the invoice's id.
                invoice=str(invoice["id"] if isinstance(invoice, dict) else invoice)
                if invoice
                else None,
            )
        )
    return items


def upcoming_invoice_total(client: stripe.StripeClient, customer: str) -> int | None:
    """The total in cents of the invoice Stripe would create next, or None if there is none."""
    try:
        preview = client.v1.invoices.create_preview(params={"customer": customer})
    except stripe.InvalidRequestError as exc:
        if exc.code == "invoice_upcoming_none":
            return None
        raise
    return int(preview.total)
