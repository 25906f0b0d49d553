"""`cstack billing reconcile`: what Stripe will invoice for an org and period, compared line
by line with the ledger's invoice, in cents.

Stripe's side is read back through stripe-python: every invoice item of the org's Stripe
customers (pending or already on an invoice, all pages), attributed to a ledger line by
the metadata the sync puts on each item. An item without that metadata whose service
period starts in the month counts too: Stripe will invoice it and the ledger has no line
for it. The customer's upcoming-invoice total is shown as Stripe computes it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import stripe
from sqlalchemy import Connection, Engine, exists, select

from billing.ledger import StripeInvoiceItem, UsageAdjustment, UsageRow
from billing.ledger.invoice import read_invoice
from billing.prices.money import format_cents
from billing.prices.periods import period_bounds
from billing.prices.pricebook import PriceBook
from billing.stripe.api import (
    LINE,
    ORG,
    PERIOD,
    StripeItem,
    list_invoice_items,
    upcoming_invoice_total,
)
from billing.stripe.customers import org_customer
from billing.stripe.sync import pending_items

#: How a Stripe item that carries none of the sync's metadata is named among the lines.
NOT_FROM_LEDGER = "not from the ledger"


class CannotReconcile(ValueError):
    """Bad input: an org the ledger does not know, or one that has no Stripe customer."""


@dataclass(frozen=True)
class LineComparison:
    key: str
    ledger_cents: int
    stripe_cents: int

    @property
    def difference(self) -> int:
        return self.stripe_cents - self.ledger_cents


@dataclass
class Reconciliation:
    org_id: str
    period: str
    customers: list[str]
    lines: list[LineComparison] = field(default_factory=list)
    #: Items the sync has planned that Stripe has not accepted yet.
    unsent: int = 0
    #: Each customer's upcoming-invoice total in cents (None: Stripe has no upcoming one).
    upcoming: dict[str, int | None] = field(default_factory=dict)

    @property
    def differences(self) -> list[LineComparison]:
        return [line for line in self.lines if line.difference]

    @property
    def agree(self) -> bool:
        return not self.differences

    def render(self) -> str:
        width = max([len(line.key) for line in self.lines] + [24])
        out = [
            f"Reconciliation of {self.org_id} for {self.period} "
            f"(Stripe customer {', '.join(self.customers)})",
            f"  {'line':<{width}} {'ledger':>14} {'Stripe':>14} {'difference':>14}",
        ]
        for line in self.lines:
            difference = _signed(line.difference) if line.difference else ""
            out.append(
                f"  {line.key:<{width}} {format_cents(line.ledger_cents):>14} "
                f"{format_cents(line.stripe_cents):>14} {difference:>14}"
            )
        ledger = sum(line.ledger_cents for line in self.lines)
        posted = sum(line.stripe_cents for line in self.lines)
        out.append(
            f"  {'total':<{width}} {format_cents(ledger):>14} {format_cents(posted):>14} "
            f"{_signed(posted - ledger) if posted != ledger else '':>14}"
        )
        for customer, total in self.upcoming.items():
            shown = "none" if total is None else format_cents(total)
            out.append(f"Stripe's upcoming invoice for {customer} (all pending items): {shown}")
        if self.unsent:
            out.append(f"{self.unsent} planned item(s) not yet accepted by Stripe (retried)")
        if self.agree:
            out.append("agree: Stripe invoices what the ledger says, to the cent")
        else:
            named = ", ".join(
                f"{line.key} ({_signed(line.difference)})" for line in self.differences
            )
            out.append(f"differ: {named}")
        return "\n".join(line.rstrip() for line in out)


def _signed(cents: int) -> str:
    return ("+" if cents > 0 else "") + format_cents(cents)


def _org_known(connection: Connection, org_id: str) -> bool:
    return bool(
        connection.execute(
            select(
                exists().where(UsageRow.org_id == org_id)
                | exists().where(UsageAdjustment.org_id == org_id)
                | exists().where(StripeInvoiceItem.org_id == org_id)
            )
        ).scalar_one()
    )


def stripe_customers(connection: Connection, org_id: str, period: str) -> list[str]:
    """Customers that may hold the period's items: those posted to, and the org's own."""
    customers = set(
        connection.execute(
            select(StripeInvoiceItem.customer_id)
            .where(StripeInvoiceItem.org_id == org_id, StripeInvoiceItem.period == period)
            .distinct()
        ).scalars()
    )
    current = org_customer(connection, org_id)
    if current is not None:
        customers.add(current)
    return sorted(customers)


def compare_org(
    connection: Connection,
    book: PriceBook,
    org_id: str,
    period: str,
    items: dict[str, list[StripeItem]],
    *,
    with_others: bool = True,
) -> Reconciliation:
    """``org_id``'s invoice for ``period`` against Stripe's ``items`` of each of its
    customers (``stripe_customers``), line by line; ``with_others``: items not from the
    ledger whose service period starts in the month are lines too."""
    lower, upper = period_bounds(period)
    invoice = read_invoice(connection, book, org_id, period)
    ledger = {line.key: line.amount_cents for line in invoice.lines}
    posted: dict[str, int] = defaultdict(int)
    customers = sorted(items)
    result = Reconciliation(org_id=org_id, period=period, customers=customers)
    for customer in customers:
        for item in items[customer]:
            if ORG in item.metadata:
                if item.metadata[ORG] == org_id and item.metadata.get(PERIOD) == period:
                    posted[item.metadata.get(LINE, "(no line)")] += item.amount_cents
            elif (
                with_others
                and item.period_start is not None
                and lower.timestamp() <= item.period_start < upper.timestamp()
            ):
                posted[f"{NOT_FROM_LEDGER}: {item.id} {item.description}"] += item.amount_cents
    order = [line.key for line in invoice.lines] + sorted(posted.keys() - ledger.keys())
    result.lines = [
        LineComparison(key=key, ledger_cents=ledger.get(key, 0), stripe_cents=posted.get(key, 0))
        for key in order
    ]
    result.unsent = pending_items(connection, org_id, period)
    return result


def reconcile(
    engine: Engine, book: PriceBook, client: stripe.StripeClient, org_id: str, period: str
) -> Reconciliation:
    period_bounds(period)
    with engine.connect() as connection:
        if not _org_known(connection, org_id):
            raise CannotReconcile(f"unknown org {org_id!r}: the ledger has nothing for it")
        customers = stripe_customers(connection, org_id, period)
    if not customers:
        raise CannotReconcile(f"org {org_id!r} has no Stripe customer")
    items = {customer: list_invoice_items(client, customer) for customer in customers}
    with engine.connect() as connection:
        result = compare_org(connection, book, org_id, period, items)
    for customer in customers:
        result.upcoming[customer] = upcoming_invoice_total(client, customer)
    return result
