"""Stripe invoices what the ledger invoices, to the cent: an invoice item per invoice line.

Two steps, run by the billing worker (one at a time, under a Redis lock):

``plan_changed_invoices``: every ledger write queues its (org, period) in
``stripe_invoice_changes``. For each queued period that is due and whose org has a Stripe
customer, one transaction recomputes the invoice from the ledger and points each line's
item at it (billing/stripe/items.py: made, changed in place, removed, or an adjustment
once the item was finalized), then dequeues the period unless a write queued it again
meanwhile.

``send_invoice_items``: brings Stripe to each pending item. A new item is posted with the
idempotency key ``cstack.{org}.{period}.{line}.{revision}`` and the parameters fixed at its
first attempt, so a resend after a crash or a lost answer replays Stripe's first answer
instead of adding a second item; Stripe forgets keys after a day, so an item first tried
longer ago is looked for among the customer's items first. A change is an update of the
item (its key suffixed by the update's number), and a removal a delete, each made only
after Stripe says the item's invoice is still a draft or there is none: an item on a
finalized invoice is marked ``final`` with what Stripe holds, and its period queued again,
so the difference becomes an adjustment. Failures back off exponentially per item.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import stripe
from sqlalchemy import Connection, Engine, delete, func, select, update
from sqlalchemy.exc import IntegrityError

from billing import metrics
from billing.ledger import InvoiceChange, OrgCustomer, StripeInvoiceItem
from billing.ledger.writes import queue_invoice_changes
from billing.prices.periods import period_bounds, period_of
from billing.prices.pricebook import PriceBook, PriceBookError
from billing.settings import BillingSettings
from billing.stripe.api import (
    LINE,
    ORG,
    PERIOD,
    REVISION,
    create_invoice_item,
    delete_invoice_item,
    finalized_invoice,
    list_invoice_items,
    service_period,
    stripe_client,
    update_invoice_item,
)
from billing.stripe.customers import orgs_without_customer
from billing.stripe.items import (
    MAX_IDEMPOTENCY_KEY,
    ItemFields,
    idempotency_key,
    item_metadata,
    plan_period,
    row_fields,
    stripe_state,
)

logger = logging.getLogger(__name__)

PLAN_PERIODS_PER_RUN = 500
SEND_PER_RUN = 1_000
#: Stripe prunes idempotency keys once they are 24 hours old; an hour of margin.
IDEMPOTENCY_WINDOW = timedelta(hours=23)

__all__ = ["idempotency_key", "plan_period", "sync_stripe"]


@dataclass
class SyncResult:
    #: Items made or changed by the plan.
    planned: int = 0
    #: Items Stripe was brought to (created, updated or deleted).
    sent: int = 0
    failed: int = 0
    #: Periods that could not be planned (a price version missing from the book...).
    plan_errors: int = 0
    #: Items found on a finalized invoice (their line's change becomes an adjustment).
    finalized: int = 0


def first_open_period(now: datetime, settings: BillingSettings) -> str | None:
    """Periods before this one are due for posting (None: every period is)."""
    if settings.stripe_post_open_periods:
        return None
    return period_of(now - timedelta(seconds=settings.stripe_invoice_grace_s))


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


class ItemSender:
    """Brings Stripe to one pending item, committing each step before the next request."""

    def __init__(self, engine: Engine, client: stripe.StripeClient, now: datetime) -> None:
        self.engine, self.client, self.now = engine, client, now

    def save(self, item: Any, **values: Any) -> None:
        with self.engine.begin() as connection:
            connection.execute(
                update(StripeInvoiceItem).where(StripeInvoiceItem.id == item.id).values(**values)
            )

    def send(self, item: Any) -> str:
        """What was done: created, updated, deleted, finalized (found final) or dropped."""
        if item.stripe_item_id is None:
            if item.removal and item.first_attempt_at is None:
                self.save(item, status="deleted")
                return "dropped"
            item_id, created_state = self._create(item)
            self.save(item, stripe_item_id=item_id, stripe_state=created_state)
            item.stripe_item_id, item.stripe_state = item_id, created_state
        wanted = stripe_state(row_fields(item))
        if not item.removal and item.stripe_state == wanted:
            self.save(item, status="sent", sent_at=self.now)
            return "created"
        invoice = finalized_invoice(self.client, item.stripe_item_id)
        if invoice is not None:
            self._finalized(item, invoice)
            return "finalized"
        if item.removal:
            delete_invoice_item(self.client, item.stripe_item_id)
            self.save(item, status="deleted", sent_at=self.now)
            return "deleted"
        body = json.dumps(row_fields(item).params(), sort_keys=True)
        seq = item.update_seq
        if item.update_body != body:  # a new change: its own key, fixed before it leaves
            seq += 1
            self.save(item, update_seq=seq, update_body=body)
        update_invoice_item(
            self.client, item.stripe_item_id, json.loads(body), _update_key(item, seq)
        )
        self.save(item, status="sent", stripe_state=wanted, sent_at=self.now)
        return "updated"

    def _create(self, item: Any) -> tuple[str, str]:
        """Post the item (unless an attempt beyond Stripe's key memory already did): its id
        and what Stripe then holds."""
        body = item.create_body
        if body is None:
            start, end = period_bounds(item.period)
            params = {
                "customer": item.customer_id,
                "currency": "usd",
                **row_fields(item).params(),
                "metadata": item_metadata(
                    item.org_id, item.period, item.line_key, item.revision, item.kind
                ),
                "period": service_period(start, end),
            }
            body = json.dumps({"params": params, "tokens": item.quantity}, sort_keys=True)
            # Committed before the request leaves: a resend after a crash sends the same.
            self.save(item, create_body=body, first_attempt_at=self.now)
            item.create_body, item.first_attempt_at = body, self.now
        stored = json.loads(body)
        params = stored["params"]
        unit = params.get("unit_amount_decimal")
        created = stripe_state(
            ItemFields(
                int(Decimal(unit) * params["quantity"]) if unit else params["amount"],
                params.get("quantity") if unit else stored["tokens"],
                unit,
                params["description"],
            )
        )
        if self.now - item.first_attempt_at >= IDEMPOTENCY_WINDOW:
            found = self._already_in_stripe(item)
            if found is not None:
                return found, created
        return create_invoice_item(self.client, params, item.idempotency_key), created

    def _already_in_stripe(self, item: Any) -> str | None:
        """The id of the Stripe item an earlier attempt created, if one did (items posted
        before adjustments existed carry no kind: the other four keys name it)."""
        wanted = item_metadata(item.org_id, item.period, item.line_key, item.revision, item.kind)
        for posted in list_invoice_items(self.client, item.customer_id):
            if all(posted.metadata.get(k) == wanted[k] for k in (ORG, PERIOD, LINE, REVISION)):
                return posted.id
        return None

    def _finalized(self, item: Any, invoice: str) -> None:
        """The item is on a finalized invoice: it stays as Stripe holds it, and its
        period is planned again (the difference becomes an adjustment)."""
        held = json.loads(item.stripe_state or stripe_state(row_fields(item)))
        with self.engine.begin() as connection:
            connection.execute(
                update(StripeInvoiceItem)
                .where(StripeInvoiceItem.id == item.id)
                .values(
                    status="final",
                    removal=False,
                    invoice_id=invoice,
                    amount_cents=held["amount"],
                    quantity=held.get("tokens"),
                    unit_amount_decimal=held["unit_amount_decimal"],
                    description=held["description"],
                )
            )
            queue_invoice_changes(connection, {(item.org_id, item.period)})


def _update_key(item: Any, seq: int) -> str:
    key = f"{item.idempotency_key}.u{seq}"
    return key if len(key) <= MAX_IDEMPOTENCY_KEY else f"{item.idempotency_key[:200]}.u{seq}"


def send_invoice_items(
    engine: Engine, client: stripe.StripeClient, settings: BillingSettings, now: datetime
) -> tuple[int, int, int]:
    """Bring Stripe to the due pending items; returns (sent, failed, found finalized)."""
    with engine.connect() as connection:
        due = connection.execute(
            select(StripeInvoiceItem)
            .where(StripeInvoiceItem.status == "pending")
            .where(StripeInvoiceItem.next_attempt_at <= now)
            .order_by(StripeInvoiceItem.id)
            .limit(SEND_PER_RUN)
        ).all()
    sender = ItemSender(engine, client, now)
    sent = failed = finalized = 0
    for row in due:
        item = SimpleNamespace(**row._asdict())  # the sender records its steps on it
        attempts = item.attempts + 1
        try:
            done = sender.send(item)
        except stripe.StripeError as exc:
            failed += 1
            logger.warning(
                "Stripe invoice item %s failed (attempt %d): %s",
                item.idempotency_key,
                attempts,
                exc,
            )
            sender.save(
                item,
                attempts=attempts,
                next_attempt_at=now + backoff(attempts, settings),
                last_error=str(exc)[:2000],
            )
            metrics.stripe_invoice_items.labels("failed").inc()
            continue
        if done == "finalized":
            finalized += 1
        elif done != "dropped":
            sent += 1
            metrics.stripe_invoice_items.labels("sent").inc()
    return sent, failed, finalized


def pending_items(connection: Connection, org_id: str, period: str) -> int:
    """Items of (org, period) that Stripe has not been brought to yet."""
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
    client = stripe_client(settings)
    sent, failed, finalized = send_invoice_items(engine, client, settings, current)
    if finalized:  # their lines' changes are adjustments now: planned and sent at once
        more, errors = plan_changed_invoices(engine, book, settings, current)
        planned, plan_errors = planned + more, plan_errors + errors
        more_sent, more_failed, _ = send_invoice_items(engine, client, settings, current)
        sent, failed = sent + more_sent, failed + more_failed
    if failed or plan_errors:
        metrics.stripe_sync_failures.inc()
    else:
        metrics.stripe_last_success.set(current.timestamp())
    return SyncResult(
        planned=planned, sent=sent, failed=failed, plan_errors=plan_errors, finalized=finalized
    )
