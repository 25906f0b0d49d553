"""The ledger's tables.

``usage_events`` is append-only (the migration installs triggers that refuse UPDATE and
DELETE): a correction is a row in ``usage_adjustments``, and Stripe reporting state lives
in its own tables (changed invoices, invoice items) so that it never touches a usage row.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, DateTime, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

Id = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC (SQLite has no time zones), returned as aware UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("ledger timestamps must be timezone-aware")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class UsageRow(Base):
    __tablename__ = "usage_events"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(200), unique=True)
    org_id: Mapped[str] = mapped_column(String(200))
    key_id: Mapped[str] = mapped_column(String(200))
    customer_id: Mapped[str | None] = mapped_column(String(200))
    plan: Mapped[str] = mapped_column(String(100))
    model: Mapped[str] = mapped_column(String(200))
    tier: Mapped[str] = mapped_column(String(20))
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    #: Of the completion tokens, those spent reasoning (None: not recorded, rows written
    #: before receipts were).
    reasoning_tokens: Mapped[int | None] = mapped_column(BigInteger)
    #: The client's own ``x-request-id``, when it sent one (receipts can be found by it).
    client_request_id: Mapped[str | None] = mapped_column(String(128))
    list_cost_nano_usd: Mapped[int] = mapped_column(BigInteger)
    #: List cost / promotion multiplier: what the request takes of the allowance while
    #: enough is left (billing.allowance decides, in start order, how much it got).
    allowance_cost_nano_usd: Mapped[int] = mapped_column(BigInteger)
    promotion_multiplier: Mapped[str] = mapped_column(String(40))
    promotion_id: Mapped[str | None] = mapped_column(String(100))
    price_version: Mapped[str] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime)
    outcome: Mapped[str] = mapped_column(String(40))
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_usage_events_org_started", "org_id", "started_at"),
        Index("ix_usage_events_customer", "customer_id"),
        Index("ix_usage_events_org_key_started", "org_id", "key_id", "started_at"),
        Index("ix_usage_events_org_client_request", "org_id", "client_request_id"),
    )


class UsageAdjustment(Base):
    """A correction to the amount due: never an edit of a usage row, and outside the
    allowance (it is added to, or credited from, what the invoice charges)."""

    __tablename__ = "usage_adjustments"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    adjustment_id: Mapped[str] = mapped_column(String(200), unique=True)
    org_id: Mapped[str] = mapped_column(String(200), index=True)
    event_id: Mapped[str | None] = mapped_column(String(200))
    tier: Mapped[str] = mapped_column(String(20))
    effective_at: Mapped[datetime] = mapped_column(UTCDateTime)
    list_cost_delta_nano_usd: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class InvoiceChange(Base):
    """An (org, period) whose invoice changed since Stripe sync last planned it.

    Every ledger write bumps ``changes`` in its own transaction; the planner reads the
    count, mirrors the invoice into Stripe items and deletes the row only if the count is
    still what it read, so a write that lands meanwhile leaves the period queued.
    """

    __tablename__ = "stripe_invoice_changes"

    org_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    #: ``YYYY-MM``, the UTC calendar month (string order is time order).
    period: Mapped[str] = mapped_column(String(7), primary_key=True)
    changes: Mapped[int] = mapped_column(BigInteger)


class StripeInvoiceItem(Base):
    """One Stripe invoice item: the item of an invoice line, or an adjustment of one.

    A line has one item (``kind`` "line", revision 1), kept equal to the line by updates
    while it is pending or on a draft invoice. Once its invoice is finalized the item is
    ``final`` and a later change of the line is an ``adjustment`` item (the next
    revision), itself updated until its own invoice is finalized. The item's fields here
    are what it should be; ``stripe_state`` is what Stripe last confirmed it is.
    """

    __tablename__ = "stripe_invoice_items"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    org_id: Mapped[str] = mapped_column(String(200))
    period: Mapped[str] = mapped_column(String(7))
    line_key: Mapped[str] = mapped_column(String(200))
    revision: Mapped[int] = mapped_column(Integer)
    #: "line" or "adjustment".
    kind: Mapped[str] = mapped_column(String(20), default="line")
    customer_id: Mapped[str] = mapped_column(String(200))
    #: Signed integer cents (credits are negative), in USD.
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    #: Tokens the item stands for (an adjustment's: the change), None for credits.
    quantity: Mapped[int | None] = mapped_column(BigInteger)
    #: Cents per token where quantity x it is exactly the amount (Stripe then shows both);
    #: None: an amount, with the tokens in the description.
    unit_amount_decimal: Mapped[str | None] = mapped_column(String(40))
    description: Mapped[str] = mapped_column(Text)
    #: The item must not exist (its line went to zero, or it is at a former customer).
    removal: Mapped[bool] = mapped_column(default=False)
    #: Idempotency key of its creation; its updates add ``.u{update_seq}``.
    idempotency_key: Mapped[str] = mapped_column(String(255), unique=True)
    #: pending (Stripe must be brought to it), sent, final (on a finalized invoice:
    #: never changed again), deleted.
    status: Mapped[str] = mapped_column(String(20), default="pending", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: Set before the first request leaves, so a resend after Stripe's idempotency window
    #: knows to look for the item first.
    first_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The creation's parameters (JSON), fixed at its first attempt: a resend must be the
    #: same request for Stripe to replay it.
    create_body: Mapped[str | None] = mapped_column(Text)
    #: What Stripe has (JSON: amount, quantity, unit_amount_decimal, description).
    stripe_state: Mapped[str | None] = mapped_column(Text)
    #: The update on its way (JSON) and its number (its idempotency key's suffix).
    update_body: Mapped[str | None] = mapped_column(Text)
    update_seq: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    stripe_item_id: Mapped[str | None] = mapped_column(String(100))
    #: The Stripe invoice it is on, once it is final.
    invoice_id: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("org_id", "period", "line_key", "revision"),
        Index("ix_stripe_invoice_items_org_period", "org_id", "period"),
    )


class OrgCustomer(Base):
    """The Stripe customer an org's invoices go to (none: its usage waits for one)."""

    __tablename__ = "org_customers"

    org_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    customer_id: Mapped[str | None] = mapped_column(String(200), index=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class StripeWebhookEvent(Base):
    """Webhook events already handled (Stripe delivers at least once)."""

    __tablename__ = "stripe_webhook_events"

    event_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    type: Mapped[str] = mapped_column(String(100))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime)


class OrgSuspension(Base):
    """Durable record of an org's suspension; Redis holds the copy admission reads."""

    __tablename__ = "org_suspensions"

    org_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    customer_id: Mapped[str | None] = mapped_column(String(200))
    suspended: Mapped[bool]
    reason: Mapped[str] = mapped_column(String(200))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: ``created`` of the Stripe event that set ``suspended``: an older event arriving
    #: later does not override it.
    event_created_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
