"""`cstack billing reconcile --all`: every org's invoice of a month against Stripe, and each
customer's upcoming invoice against the ledger; the billing worker runs it daily.

Every org with usage, adjustments or items in the month is compared line by line
(billing.stripe.reconcile), each of its customers' items listed once for all its orgs. An org
with usage and no Stripe customer cannot be compared: it is listed apart, with what its
invoice would be. Then each customer's upcoming invoice (Stripe's total of the items not
yet on an invoice, whatever their month) is explained: the ledger's amount of each
pending item the sync posted, plus the pending items not from the ledger, listed apart.
What is left is something Stripe adds that the ledger does not (a subscription, a tax, a
discount) or an item Stripe holds at another amount than the ledger.

The daily run exports how many orgs differ and the sum of their absolute differences in
nano-USD, and logs each org with its difference (metric labels never name an org).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

import stripe
from sqlalchemy import Connection, Engine, select, union

from billing import metrics
from billing.ledger import StripeInvoiceItem, UsageAdjustment, UsageRow
from billing.ledger.invoice import read_invoice
from billing.prices.money import NANO_PER_CENT, format_cents
from billing.prices.periods import period_bounds
from billing.prices.pricebook import PriceBook
from billing.stripe.api import ORG, StripeItem, list_invoice_items, upcoming_invoice_total
from billing.stripe.customers import org_customer
from billing.stripe.reconcile import Reconciliation, compare_org, stripe_customers

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Upcoming:
    """A customer's upcoming invoice, explained by the ledger."""

    customer: str
    #: Stripe's total in cents (None: Stripe has no upcoming invoice for it).
    stripe_cents: int | None
    #: The ledger's amounts of the pending items the sync posted.
    ledger_cents: int
    #: Pending items not from the ledger: (id, description, cents).
    others: list[tuple[str, str, int]]

    @property
    def difference(self) -> int:
        return (self.stripe_cents or 0) - self.ledger_cents - sum(c for *_, c in self.others)


@dataclass
class FullReconciliation:
    period: str
    orgs: list[Reconciliation] = field(default_factory=list)
    #: Orgs with usage and no Stripe customer, and what their invoice would be (cents).
    without_customer: dict[str, int] = field(default_factory=dict)
    upcoming: list[Upcoming] = field(default_factory=list)

    @property
    def differing(self) -> list[Reconciliation]:
        return [org for org in self.orgs if not org.agree]

    @property
    def difference_cents(self) -> int:
        """The sum over orgs of their lines' absolute differences."""
        return sum(abs(line.difference) for org in self.orgs for line in org.lines)

    @property
    def agree(self) -> bool:
        """No org differs, no org without a customer owes anything, and every upcoming
        invoice is explained."""
        return not (
            self.differing
            or any(self.without_customer.values())
            or any(up.difference for up in self.upcoming)
        )

    def render(self) -> str:
        out = [f"Reconciliation of every org for {self.period}"]
        for org in self.orgs:
            ledger = sum(line.ledger_cents for line in org.lines)
            posted = sum(line.stripe_cents for line in org.lines)
            verdict = "agree" if org.agree else f"differ by {_signed(posted - ledger)}"
            out.append(
                f"  {org.org_id}: ledger {format_cents(ledger)}, Stripe {format_cents(posted)}"
                f" ({', '.join(org.customers)}): {verdict}"
            )
        for org in self.differing:
            out += ["", org.render()]
        if self.without_customer:
            out.append("")
            for org_id, cents in self.without_customer.items():
                out.append(
                    f"no Stripe customer: {org_id} ({format_cents(cents)} not invoiced; "
                    f"`cstack keys customer {org_id} cus_...`)"
                )
        for up in self.upcoming:
            shown = "none" if up.stripe_cents is None else format_cents(up.stripe_cents)
            out.append(
                f"upcoming invoice of {up.customer}: Stripe {shown}, from the ledger "
                f"{format_cents(up.ledger_cents)}, not from the ledger "
                f"{format_cents(sum(c for *_, c in up.others))}"
                + (f", unexplained {_signed(up.difference)}" if up.difference else "")
            )
            for item_id, description, cents in up.others:
                out.append(f"  not from the ledger: {item_id} {description} ({_signed(cents)})")
        summary = (
            f"{len(self.orgs)} org(s) compared, {len(self.differing)} differ "
            f"(in all {format_cents(self.difference_cents)})"
        )
        if self.without_customer:
            summary += f", {len(self.without_customer)} without a Stripe customer"
        out += ["", summary + (": agree" if self.agree else "")]
        return "\n".join(line.rstrip() for line in out)


def _signed(cents: int) -> str:
    return ("+" if cents > 0 else "") + format_cents(cents)


def orgs_in(connection: Connection, period: str) -> list[str]:
    """Orgs with usage, adjustments or Stripe items in ``period``."""
    lower, upper = period_bounds(period)
    found = union(
        select(UsageRow.org_id).where(UsageRow.started_at >= lower, UsageRow.started_at < upper),
        select(UsageAdjustment.org_id).where(
            UsageAdjustment.effective_at >= lower, UsageAdjustment.effective_at < upper
        ),
        select(StripeInvoiceItem.org_id).where(StripeInvoiceItem.period == period),
    )
    return sorted(connection.execute(found).scalars())


def reconcile_all(
    engine: Engine, book: PriceBook, client: stripe.StripeClient, period: str
) -> FullReconciliation:
    result = FullReconciliation(period=period)
    items: dict[str, list[StripeItem]] = {}
    with engine.connect() as connection:
        for org_id in orgs_in(connection, period):
            customers = stripe_customers(connection, org_id, period)
            if org_customer(connection, org_id) is None and not customers:
                invoice = read_invoice(connection, book, org_id, period)
                result.without_customer[org_id] = invoice.total_cents
                continue
            for customer in customers:
                if customer not in items:
                    items[customer] = list_invoice_items(client, customer)
            # Items not from the ledger are the customer's, not an org's: listed apart.
            mine = {customer: items[customer] for customer in customers}
            result.orgs.append(
                compare_org(connection, book, org_id, period, mine, with_others=False)
            )
        for customer in sorted(items):
            result.upcoming.append(_upcoming(connection, client, customer, items[customer]))
    return result


def _upcoming(
    connection: Connection, client: stripe.StripeClient, customer: str, items: list[StripeItem]
) -> Upcoming:
    pending = [item for item in items if item.invoice is None]
    ours = [item.id for item in pending if ORG in item.metadata]
    ledger = dict(
        connection.execute(
            select(StripeInvoiceItem.stripe_item_id, StripeInvoiceItem.amount_cents).where(
                StripeInvoiceItem.stripe_item_id.in_(ours)
            )
        ).all()
    )
    return Upcoming(
        customer=customer,
        stripe_cents=upcoming_invoice_total(client, customer),
        # An item of ours the ledger has no row for is Stripe's amount of it (a line
        # comparison already shows it).
        ledger_cents=sum(
            ledger.get(item.id, item.amount_cents) for item in pending if ORG in item.metadata
        ),
        others=[
            (item.id, item.description, item.amount_cents)
            for item in pending
            if ORG not in item.metadata
        ],
    )


def export(results: list[FullReconciliation], at: datetime) -> None:
    """The daily run's metrics and log: no org or customer in a label (they identify
    customers, and a series per org would grow without bound), so a count and a sum over
    the months checked, and the orgs by name in the log."""
    metrics.reconcile_orgs_differing.set(sum(len(result.differing) for result in results))
    metrics.reconcile_difference_nano_usd.set(
        sum(result.difference_cents for result in results) * NANO_PER_CENT
    )
    metrics.reconcile_upcoming_difference_nano_usd.set(
        sum(abs(up.difference) for result in results for up in result.upcoming) * NANO_PER_CENT
    )
    metrics.reconcile_last_run.set(at.timestamp())
    for result in results:
        _log(result)


def _log(result: FullReconciliation) -> None:
    for org in result.differing:
        difference = sum(line.difference for line in org.lines)
        logger.warning(
            "reconcile %s: %s differs from Stripe by %s (%s)",
            result.period,
            org.org_id,
            _signed(difference),
            ", ".join(f"{line.key} {_signed(line.difference)}" for line in org.differences),
        )
    for up in result.upcoming:
        if up.difference:
            logger.warning(
                "reconcile %s: the upcoming invoice of %s has %s the ledger does not explain",
                result.period,
                up.customer,
                _signed(up.difference),
            )
    for org_id, cents in result.without_customer.items():
        logger.warning(
            "reconcile %s: %s has no Stripe customer (%s not invoiced)",
            result.period,
            org_id,
            format_cents(cents),
        )
    if result.agree:
        logger.info("reconcile %s: %d org(s) agree with Stripe", result.period, len(result.orgs))
