"""The Stripe calls billing makes, through stripe-python: invoice items (created, updated,
deleted, read back), their invoices' state, and the upcoming invoice.

One place for the client's configuration and for the request shapes, so that the sync
(billing/stripe/sync.py) and `cstack billing reconcile` (billing/stripe/reconcile.py) read and
write Stripe the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import stripe

from billing.settings import BillingSettings

#: Metadata keys on every invoice item billing posts; reconcile attributes items by them.
ORG = "cstack_org"
PERIOD = "cstack_period"
LINE = "cstack_line"
REVISION = "cstack_revision"
#: "line" or "adjustment" (items posted before adjustments existed have none).
KIND = "cstack_kind"
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
    quantity: int = 1
    #: Cents per unit when the item is quantity x unit amount (None: an amount).
    unit_amount_decimal: str | None = None


def create_invoice_item(
    client: stripe.StripeClient, params: dict[str, Any], idempotency_key: str
) -> str:
    """Post one item (``params``: billing.stripe.items builds them); its id."""
    item = client.v1.invoice_items.create(
        params=params,  # type: ignore[arg-type]
        options={"idempotency_key": idempotency_key},
    )
    return str(item.id)


def update_invoice_item(
    client: stripe.StripeClient, item_id: str, params: dict[str, Any], idempotency_key: str
) -> None:
    """Change an item in place (Stripe refuses once its invoice is finalized)."""
    client.v1.invoice_items.update(
        item_id,
        params=params,  # type: ignore[arg-type]
        options={"idempotency_key": idempotency_key},
    )


def delete_invoice_item(client: stripe.StripeClient, item_id: str) -> None:
    """Remove an item (Stripe refuses once its invoice is finalized); one already gone is
    gone."""
    try:
        client.v1.invoice_items.delete(item_id)
    except stripe.InvalidRequestError as exc:
        if exc.code != "resource_missing":
            raise


def finalized_invoice(client: stripe.StripeClient, item_id: str) -> str | None:
    """The invoice ``item_id`` is on when that invoice is no longer a draft (the item can
    no longer change), else None."""
    item = client.v1.invoice_items.retrieve(item_id).to_dict()
    invoice = item.get("invoice")
    if not invoice:
        return None
    invoice_id = str(invoice["id"] if isinstance(invoice, dict) else invoice)
    status = client.v1.invoices.retrieve(invoice_id).to_dict().get("status")
    return None if status == "draft" else invoice_id


def service_period(start: datetime, end: datetime) -> dict[str, int]:
    """A month as an item's service period (shown on the invoice; its end is inclusive)."""
    return {"start": int(start.timestamp()), "end": int((end - timedelta(seconds=1)).timestamp())}


def _unit_amount(pricing: Any) -> str | None:
    unit = (pricing or {}).get("unit_amount_decimal")
    return None if unit is None else str(unit)


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
                quantity=int(data.get("quantity") or 1),
                unit_amount_decimal=_unit_amount(data.get("pricing")),
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
