"""Stripe invoices what the ledger invoices, to the cent: invoice items mirror invoice lines.

Each line of an (org, period) invoice (billing/invoice.py: usage per tier, direction and
price version at list price, the launch promotion credit, the included-allowance credit,
adjustments) has a stable key, and the Stripe invoice items of that (org, period, key)
add up to the line's rounded cents. Two steps:

``plan_changed_invoices``: every ledger write queues its (org, period) in
``stripe_invoice_changes``. For each queued period that is due, one transaction recomputes
the invoice from the ledger, compares each line with the items planned so far, records a
pending item for every difference (the line's next revision) and dequeues the period
unless a write queued it again meanwhile. Late usage is simply another difference.

``send_invoice_items``: each pending item is posted with the idempotency key
``cstack.{org}.{period}.{line}.{revision}``, so a resend after a crash or a lost answer
replays Stripe's first answer instead of adding a second item; failures back off
exponentially per item. Stripe forgets idempotency keys after a day, so an item first
tried longer ago than that is looked for among the customer's items before it is posted.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import stripe
from sqlalchemy import Connection, Engine, Row, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from billing import metrics
from billing.customers import org_customer, orgs_without_customer
from billing.invoice import read_invoice
from billing.ledger import InvoiceChange, OrgCustomer, StripeInvoiceItem
from billing.periods import period_bounds, period_of
from billing.pricebook import PriceBook, PriceBookError
from billing.settings import BillingSettings
from billing.stripe_api import (
    LINE,
    ORG,
    PERIOD,
    REVISION,
    create_invoice_item,
    list_invoice_items,
    stripe_client,
)

logger = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY = 255
PLAN_PERIODS_PER_RUN = 500
SEND_PER_RUN = 1_000
#: Stripe prunes idempotency keys once they are 24 hours old; an hour of margin.
IDEMPOTENCY_WINDOW = timedelta(hours=23)


@dataclass
class SyncResult:
    planned: int = 0
    sent: int = 0
    failed: int = 0
    #: Periods that could not be planned (a price version missing from the book...).
    plan_errors: int = 0


def idempotency_key(org_id: str, period: str, line_key: str, revision: int) -> str:
    """Deterministic per item, within Stripe's 255 characters."""
    key = f"cstack.{org_id}.{period}.{line_key}.{revision}"
    if len(key) <= MAX_IDEMPOTENCY_KEY:
        return key
    return "cstack." + hashlib.sha256(key.encode()).hexdigest()


def item_metadata(org_id: str, period: str, line_key: str, revision: int) -> dict[str, str]:
    return {ORG: org_id, PERIOD: period, LINE: line_key, REVISION: str(revision)}


def first_open_period(now: datetime, settings: BillingSettings) -> str | None:
    """Periods before this one are due for posting (None: every period is)."""
    if settings.stripe_post_open_periods:
        return None
    return period_of(now - timedelta(seconds=settings.stripe_invoice_grace_s))


def plan_period(
    connection: Connection, book: PriceBook, org_id: str, period: str, now: datetime
) -> int:
    """Record the items that bring Stripe to the ledger's invoice; returns how many."""
    customer = org_customer(connection, org_id)
    if customer is None:
        return 0  # never dequeued: planned once the org has a customer
    invoice = read_invoice(connection, book, org_id, period)
    planned_cents: dict[str, int] = defaultdict(int)
    revisions: dict[str, int] = {}
    descriptions: dict[str, str] = {}
    for row in connection.execute(
        select(
            StripeInvoiceItem.line_key,
            StripeInvoiceItem.revision,
            StripeInvoiceItem.amount_cents,
            StripeInvoiceItem.description,
        )
        .where(StripeInvoiceItem.org_id == org_id, StripeInvoiceItem.period == period)
        .order_by(StripeInvoiceItem.revision)
    ):
        planned_cents[row.line_key] += row.amount_cents
        revisions[row.line_key] = row.revision
        descriptions[row.line_key] = row.description
    ledger_cents = {line.key: line.amount_cents for line in invoice.lines}
    descriptions.update({line.key: line.description for line in invoice.lines})
    items = []
    # A line can also vanish (a credit brought back to zero): its items must sum to 0.
    for key in sorted(ledger_cents.keys() | planned_cents.keys()):
        delta = ledger_cents.get(key, 0) - planned_cents.get(key, 0)
        if delta == 0:
            continue
        revision = revisions.get(key, 0) + 1
        items.append(
            {
                "org_id": org_id,
                "period": period,
                "line_key": key,
                "revision": revision,
                "customer_id": customer,
                "amount_cents": delta,
                "description": descriptions[key],
                "idempotency_key": idempotency_key(org_id, period, key, revision),
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
        )
    if items:
        # (org, period, line, revision) is unique: a concurrent planner fails here instead
        # of planning the same difference twice.
        connection.execute(insert(StripeInvoiceItem), items)
    return len(items)


def plan_changed_invoices(
    engine: Engine, book: PriceBook, settings: BillingSettings, now: datetime
) -> tuple[int, int]:
    """Plan every queued period that is due; returns (items planned, periods that failed).
    Periods of orgs without a Stripe customer stay queued until they have one."""
    with_customer = select(OrgCustomer.org_id).where(OrgCustomer.customer_id.is_not(None))
    query = (
        select(InvoiceChange)
        .where(InvoiceChange.org_id.in_(with_customer))
        .order_by(InvoiceChange.period, InvoiceChange.org_id)
    )
    open_from = first_open_period(now, settings)
    if open_from is not None:
        query = query.where(InvoiceChange.period < open_from)
    with engine.connect() as connection:
        queued = connection.execute(query.limit(PLAN_PERIODS_PER_RUN)).all()
    planned = errors = 0
    for change in queued:
        try:
            with engine.begin() as connection:
                count = plan_period(connection, book, change.org_id, change.period, now)
                # Still the count read above: every write it stands for is in this plan.
                connection.execute(
                    delete(InvoiceChange).where(
                        InvoiceChange.org_id == change.org_id,
                        InvoiceChange.period == change.period,
                        InvoiceChange.changes == change.changes,
                    )
                )
        except (PriceBookError, IntegrityError) as exc:
            errors += 1
            logger.error(
                "cannot plan Stripe items for %s %s: %s", change.org_id, change.period, exc
            )
            continue
        planned += count
    return planned, errors


def backoff(attempts: int, settings: BillingSettings) -> timedelta:
    seconds = min(settings.stripe_retry_max_s, settings.stripe_retry_base_s * 2 ** (attempts - 1))
    return timedelta(seconds=seconds)


def _already_in_stripe(client: stripe.StripeClient, item: Row[Any]) -> str | None:
    """The id of the Stripe item an earlier attempt created, if one did."""
    wanted = item_metadata(item.org_id, item.period, item.line_key, item.revision)
    for posted in list_invoice_items(client, item.customer_id):
        if all(posted.metadata.get(k) == v for k, v in wanted.items()):
            return posted.id
    return None


def _send_one(client: stripe.StripeClient, item: Row[Any], now: datetime) -> str:
    """Post ``item`` (unless an attempt beyond Stripe's key memory already did); its id."""
    first = item.first_attempt_at
    if first is not None and now - first >= IDEMPOTENCY_WINDOW:
        found = _already_in_stripe(client, item)
        if found is not None:
            return found
    return create_invoice_item(
        client,
        customer=item.customer_id,
        amount_cents=item.amount_cents,
        description=item.description,
        metadata=item_metadata(item.org_id, item.period, item.line_key, item.revision),
        service_period=period_bounds(item.period),
        idempotency_key=item.idempotency_key,
    )


def send_invoice_items(
    engine: Engine, client: stripe.StripeClient, settings: BillingSettings, now: datetime
) -> tuple[int, int]:
    """Send due pending items; returns (sent, failed)."""
    with engine.connect() as connection:
        due = connection.execute(
            select(StripeInvoiceItem)
            .where(StripeInvoiceItem.status == "pending")
            .where(StripeInvoiceItem.next_attempt_at <= now)
            .order_by(StripeInvoiceItem.id)
            .limit(SEND_PER_RUN)
        ).all()
    sent = failed = 0
    for item in due:
        if item.first_attempt_at is None:
            # Committed before the request leaves: if we crash after Stripe answered, the
            # resend still knows when Stripe first saw the key.
            with engine.begin() as connection:
                connection.execute(
                    update(StripeInvoiceItem)
                    .where(StripeInvoiceItem.id == item.id)
                    .values(first_attempt_at=now)
                )
        attempts = item.attempts + 1
        try:
            stripe_id = _send_one(client, item, now)
        except stripe.StripeError as exc:
            failed += 1
            logger.warning(
                "Stripe invoice item %s failed (attempt %d): %s",
                item.idempotency_key,
                attempts,
                exc,
            )
            with engine.begin() as connection:
                connection.execute(
                    update(StripeInvoiceItem)
                    .where(StripeInvoiceItem.id == item.id)
                    .values(
                        attempts=attempts,
                        next_attempt_at=now + backoff(attempts, settings),
                        last_error=str(exc)[:2000],
                    )
                )
            metrics.stripe_invoice_items.labels("failed").inc()
            continue
        with engine.begin() as connection:
            connection.execute(
                update(StripeInvoiceItem)
                .where(StripeInvoiceItem.id == item.id)
                .values(status="sent", sent_at=now, attempts=attempts, stripe_item_id=stripe_id)
            )
        sent += 1
        metrics.stripe_invoice_items.labels("sent").inc()
    return sent, failed


def pending_items(engine: Engine, org_id: str, period: str) -> int:
    """Items planned for (org, period) that Stripe has not confirmed yet."""
    with engine.connect() as connection:
        return int(
            connection.execute(
                select(func.count())
                .select_from(StripeInvoiceItem)
                .where(StripeInvoiceItem.org_id == org_id, StripeInvoiceItem.period == period)
                .where(StripeInvoiceItem.status == "pending")
            ).scalar_one()
        )


def count_orgs_without_customer(engine: Engine, now: datetime) -> list[str]:
    """Orgs with usage this month or last and no Stripe customer: counted by a metric
    (alert ``OrgsWithoutStripeCustomer``) and logged."""
    since = period_bounds(period_of(period_bounds(period_of(now))[0] - timedelta(days=1)))[0]
    with engine.connect() as connection:
        orgs = orgs_without_customer(connection, since)
    metrics.orgs_without_stripe_customer.set(len(orgs))
    if orgs:
        logger.warning(
            "%d org(s) with usage have no Stripe customer, so it is not invoiced: %s",
            len(orgs),
            ", ".join(orgs[:20]) + (" ..." if len(orgs) > 20 else ""),
        )
    return orgs


def sync_stripe(
    engine: Engine, book: PriceBook, settings: BillingSettings, now: datetime | None = None
) -> SyncResult:
    """One sync run: plan the changed invoices that are due, then send what is pending."""
    current = now or datetime.now(UTC)
    count_orgs_without_customer(engine, current)
    planned, plan_errors = plan_changed_invoices(engine, book, settings, current)
    sent, failed = send_invoice_items(engine, stripe_client(settings), settings, current)
    if failed or plan_errors:
        metrics.stripe_sync_failures.inc()
    else:
        metrics.stripe_last_success.set(current.timestamp())
    return SyncResult(planned=planned, sent=sent, failed=failed, plan_errors=plan_errors)
