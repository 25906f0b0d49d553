"""Stripe gets invoice items mirroring the ledger's invoice lines instead of meter events.

Adds the queue of changed (org, period) invoices and the invoice items planned for Stripe,
and drops the meter-event tables. Nothing is queued for usage already in the ledger: those
periods were reported as meter events, and posting them again would bill them twice.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from billing.ledger.schema import Id, UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stripe_invoice_changes",
        sa.Column("org_id", sa.String(200), primary_key=True),
        sa.Column("period", sa.String(7), primary_key=True),
        sa.Column("changes", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "stripe_invoice_items",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("org_id", sa.String(200), nullable=False),
        sa.Column("period", sa.String(7), nullable=False),
        sa.Column("line_key", sa.String(200), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("customer_id", sa.String(200), nullable=False),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False, unique=True),
        sa.Column("status", sa.String(20), nullable=False, index=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", UTCDateTime, nullable=False),
        sa.Column("first_attempt_at", UTCDateTime),
        sa.Column("last_error", sa.Text),
        sa.Column("stripe_item_id", sa.String(100)),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("sent_at", UTCDateTime),
        sa.UniqueConstraint("org_id", "period", "line_key", "revision"),
    )
    op.create_index(
        "ix_stripe_invoice_items_org_period", "stripe_invoice_items", ["org_id", "period"]
    )
    op.drop_table("stripe_reported_usage")
    op.drop_table("stripe_meter_events")


def downgrade() -> None:
    op.create_table(
        "stripe_meter_events",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("identifier", sa.String(100), nullable=False, unique=True),
        sa.Column("customer_id", sa.String(200), nullable=False),
        sa.Column("event_name", sa.String(100), nullable=False),
        sa.Column("minute", UTCDateTime, nullable=False),
        sa.Column("value", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(20), nullable=False, index=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", UTCDateTime, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("sent_at", UTCDateTime),
    )
    op.create_table(
        "stripe_reported_usage",
        sa.Column(
            "event_id", sa.String(200), sa.ForeignKey("usage_events.event_id"), primary_key=True
        ),
        sa.Column("batch", sa.String(100), nullable=False, index=True),
    )
    op.drop_table("stripe_invoice_items")
    op.drop_table("stripe_invoice_changes")
