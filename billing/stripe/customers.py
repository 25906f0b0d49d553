"""Which Stripe customer bills an org: the ledger's record (``org_customers``), one per org.

The org owns its customer (billing.stripe.accounts): an admin sets and changes it, and every
invoice item of the org's months goes to it. Changing it queues the months whose items
are with another customer for the Stripe sync. An org with usage and no customer keeps its months
queued, never posted, until it has one: counted by ``cstack_orgs_without_stripe_customer``,
named in the billing worker's log and listed by `cstack billing reconcile --all`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import Connection, select
from sqlalchemy.exc import SQLAlchemyError

from billing.ledger import OrgCustomer, StripeInvoiceItem, UsageRow, make_engine
from billing.ledger.writes import dialect_insert, queue_invoice_changes
from billing.stripe.accounts import AccountsUnavailable, check_customer_id


def org_customer(connection: Connection, org_id: str) -> str | None:
    return connection.execute(
        select(OrgCustomer.customer_id).where(OrgCustomer.org_id == org_id)
    ).scalar_one_or_none()


def set_org_customer(
    connection: Connection, org_id: str, customer_id: str | None, now: datetime
) -> bool:
    """Record ``org_id``'s customer; whether it changed. The months whose items are with
    another customer are queued for the Stripe sync."""
    if customer_id is not None:
        check_customer_id(customer_id)
    previous = connection.execute(
        select(OrgCustomer.customer_id).where(OrgCustomer.org_id == org_id)
    ).first()
    if previous is not None and previous.customer_id == customer_id:
        return False
    values = {"org_id": org_id, "customer_id": customer_id, "updated_at": now}
    connection.execute(
        dialect_insert(connection, OrgCustomer.__table__)
        .values(**values)
        .on_conflict_do_update(index_elements=["org_id"], set_=values)
    )
    elsewhere = connection.execute(
        select(StripeInvoiceItem.period)
        .where(StripeInvoiceItem.org_id == org_id)
        .where(
            StripeInvoiceItem.customer_id != customer_id
            if customer_id is not None
            else StripeInvoiceItem.customer_id.is_not(None)
        )
        .distinct()
    ).scalars()
    queue_invoice_changes(connection, {(org_id, period) for period in elsewhere})
    return True


def orgs_without_customer(connection: Connection, since: datetime) -> list[str]:
    """Orgs with usage that started at or after ``since`` and no Stripe customer."""
    with_customer = select(OrgCustomer.org_id).where(OrgCustomer.customer_id.is_not(None))
    return list(
        connection.execute(
            select(UsageRow.org_id)
            .where(UsageRow.started_at >= since, UsageRow.org_id.not_in(with_customer))
            .distinct()
            .order_by(UsageRow.org_id)
        ).scalars()
    )


class LedgerAccounts:
    """The ``BillingAccounts`` the gateway's admin API and CLI set customers through."""

    def __init__(self, ledger_url: str) -> None:
        self._engine = make_engine(ledger_url)

    async def set_customer(self, org_id: str, customer_id: str | None) -> None:
        await asyncio.to_thread(self._set, org_id, customer_id)

    def _set(self, org_id: str, customer_id: str | None) -> None:
        try:
            with self._engine.begin() as connection:
                set_org_customer(connection, org_id, customer_id, datetime.now(UTC))
        except SQLAlchemyError as exc:
            # The driver's message may contain the URL (with a password): its type only.
            raise AccountsUnavailable(
                f"cannot record the org's Stripe customer in the ledger ({type(exc).__name__})"
            ) from exc

    async def aclose(self) -> None:
        self._engine.dispose()
