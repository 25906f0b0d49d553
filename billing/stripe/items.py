"""What the Stripe invoice items of an (org, month) should be, from the ledger's invoice lines.

Each invoice line (billing/ledger/invoice.py) has one item at the org's Stripe customer, carrying
the line's whole amount in cents. A usage line's item shows its token quantity and unit
price where Stripe can state them exactly: quantity x ``unit_amount_decimal`` (cents per
token, at most 12 decimals) must be the line's nano-USD in whole cents, since Stripe
rounds any fraction of a cent its own way. Otherwise the item is an amount, and the
tokens are in its description. Credits and adjustments are amounts.

While the item is pending (or on a draft invoice) a change of its line updates it in
place. Once Stripe has finalized the invoice it is on, it is ``final``: a later change of
the line becomes an adjustment item for the difference (the line's next revision),
described as an adjustment of that line, and updated in place in its turn until its own
invoice is finalized. So an invoice never shows a line twice, and what Stripe holds for a
line always adds up to the line.

An item at another customer than the org's (it changed), or of a line that went to zero,
is removed while it can be (deleted); a final one stays where it was billed, and the
rest of its line goes to the org's customer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, insert, select, update

from billing.ledger import StripeInvoiceItem
from billing.ledger.invoice import InvoiceLine, read_invoice
from billing.prices.money import NANO_PER_CENT
from billing.prices.pricebook import PriceBook
from billing.stripe.api import KIND, LINE, ORG, PERIOD, REVISION
from billing.stripe.customers import org_customer

MAX_IDEMPOTENCY_KEY = 255


@dataclass(frozen=True)
class ItemFields:
    """An item's content as billing decides it."""

    amount_cents: int
    #: Tokens it stands for (None: a credit).
    quantity: int | None
    #: Cents per token, when Stripe shows quantity x unit amount (exactly the amount).
    unit_amount_decimal: str | None
    description: str

    def stripe(self) -> dict[str, Any]:
        """What Stripe will hold of it (a plain amount has no quantity of its own)."""
        exact = self.unit_amount_decimal is not None
        return {
            "amount": self.amount_cents,
            "quantity": self.quantity if exact else None,
            "unit_amount_decimal": self.unit_amount_decimal,
            "description": self.description,
        }

    def params(self) -> dict[str, Any]:
        """Its parameters in a create or update request."""
        if self.unit_amount_decimal is not None:
            price: dict[str, Any] = {
                "quantity": self.quantity,
                "unit_amount_decimal": self.unit_amount_decimal,
            }
        else:
            price = {"amount": self.amount_cents}
        return {**price, "description": self.description}


def line_fields(line: InvoiceLine) -> ItemFields:
    """The item of ``line``: quantity x unit price where that is exactly its amount."""
    quantity, price = line.quantity, line.unit_price_nano_usd
    if quantity and price and line.amount_nano_usd % NANO_PER_CENT == 0:
        unit = format(Decimal(price) / NANO_PER_CENT, "f")
        return ItemFields(line.amount_cents, quantity, unit, line.description)
    tokens = f": {quantity:,} tokens" if quantity else ""
    return ItemFields(line.amount_cents, quantity, None, line.description + tokens)


def adjustment_fields(line: InvoiceLine, cents: int, tokens: int | None) -> ItemFields:
    """An adjustment of ``line`` by ``cents`` (and ``tokens``) after its item was invoiced."""
    change = f": {tokens:+,} tokens" if tokens else ""
    return ItemFields(cents, tokens, None, f"Adjustment to {line.description}{change}")


def idempotency_key(org_id: str, period: str, line_key: str, revision: int) -> str:
    """Deterministic per item, within Stripe's 255 characters."""
    key = f"cstack.{org_id}.{period}.{line_key}.{revision}"
    if len(key) <= MAX_IDEMPOTENCY_KEY:
        return key
    return "cstack." + hashlib.sha256(key.encode()).hexdigest()


def item_metadata(
    org_id: str, period: str, line_key: str, revision: int, kind: str
) -> dict[str, str]:
    return {ORG: org_id, PERIOD: period, LINE: line_key, REVISION: str(revision), KIND: kind}


def row_fields(row: Any) -> ItemFields:
    return ItemFields(row.amount_cents, row.quantity, row.unit_amount_decimal, row.description)


def _target(connection: Connection, row: Any, fields: ItemFields | None, now: datetime) -> int:
    """Point the item ``row`` at ``fields`` (None: remove it); 1 if that changed it."""
    if fields is None:
        if row.removal:
            return 0
        # Never sent: nothing at Stripe to remove.
        status = "deleted" if row.first_attempt_at is None else "pending"
        values: dict[str, Any] = {"removal": True, "status": status}
    elif row_fields(row) == fields and not row.removal:
        return 0
    else:
        values = {
            "amount_cents": fields.amount_cents,
            "quantity": fields.quantity,
            "unit_amount_decimal": fields.unit_amount_decimal,
            "description": fields.description,
            "status": "pending",
        }
        if row.first_attempt_at is None:  # not sent yet: made as it is now
            values["create_body"] = None
    values.update(attempts=0, next_attempt_at=now, last_error=None)
    connection.execute(
        update(StripeInvoiceItem).where(StripeInvoiceItem.id == row.id).values(**values)
    )
    return 1


def plan_period(
    connection: Connection, book: PriceBook, org_id: str, period: str, now: datetime
) -> int:
    """Bring the (org, period)'s items to the ledger's invoice: how many items were made
    or changed (0 without a Stripe customer: the period waits for one)."""
    customer = org_customer(connection, org_id)
    if customer is None:
        return 0
    lines = {line.key: line for line in read_invoice(connection, book, org_id, period).lines}
    rows: dict[str, list[Any]] = {}
    for row in connection.execute(
        select(StripeInvoiceItem)
        .where(StripeInvoiceItem.org_id == org_id, StripeInvoiceItem.period == period)
        .order_by(StripeInvoiceItem.line_key, StripeInvoiceItem.revision)
    ):
        rows.setdefault(row.line_key, []).append(row)
    changed = 0
    for key in sorted(lines.keys() | rows.keys()):
        # A line gone from the invoice (a credit back to zero): its items must add to 0.
        line = lines.get(key) or InvoiceLine(key, rows[key][0].description, None, 0)
        changed += _plan_line(connection, org_id, period, customer, line, rows.get(key, []), now)
    return changed


def _plan_line(
    connection: Connection,
    org_id: str,
    period: str,
    customer: str,
    line: InvoiceLine,
    rows: list[Any],
    now: datetime,
) -> int:
    changed = 0
    live = [row for row in rows if row.status != "deleted" and not row.removal]
    # Where an item cannot follow the org's customer it is removed; a final one stays.
    for row in live:
        if row.status != "final" and row.customer_id != customer:
            changed += _target(connection, row, None, now)
    live = [row for row in live if row.status == "final" or row.customer_id == customer]
    editable = live[-1] if live and live[-1].status != "final" else None
    # Items before the last one stand as they are (final ones, or deltas posted by the
    # release before items were updated in place).
    standing = live[:-1] if editable is not None else live
    standing_cents = sum(row.amount_cents for row in standing)
    standing_tokens = sum(row.quantity or 0 for row in standing)
    cents = line.amount_cents - standing_cents
    if standing:
        tokens = (line.quantity or 0) - standing_tokens
        fields = adjustment_fields(line, cents, tokens or None)
    else:
        fields = line_fields(line)
    if editable is not None:
        if editable.kind != "line" and not standing:  # an adjustment with nothing before it
            fields = adjustment_fields(line, cents, line.quantity)
        return changed + _target(connection, editable, fields if cents else None, now)
    if not cents:
        return changed
    revision = max((row.revision for row in rows), default=0) + 1
    kind = "adjustment" if standing else "line"
    connection.execute(
        insert(StripeInvoiceItem).values(
            org_id=org_id,
            period=period,
            line_key=line.key,
            revision=revision,
            kind=kind,
            customer_id=customer,
            amount_cents=fields.amount_cents,
            quantity=fields.quantity,
            unit_amount_decimal=fields.unit_amount_decimal,
            description=fields.description,
            removal=False,
            idempotency_key=idempotency_key(org_id, period, line.key, revision),
            status="pending",
            attempts=0,
            update_seq=0,
            next_attempt_at=now,
            created_at=now,
        )
    )
    return changed + 1


def stripe_state(fields: ItemFields) -> str:
    """What Stripe holds of an item made of ``fields`` (JSON), with the tokens it stands
    for (an adjustment after it is finalized counts from them)."""
    return json.dumps({**fields.stripe(), "tokens": fields.quantity}, sort_keys=True)
