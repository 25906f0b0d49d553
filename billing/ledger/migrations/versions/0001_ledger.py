"""The ledger: append-only usage, adjustments, Stripe reporting and webhook state.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from billing.ledger.schema import Id, UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

APPEND_ONLY_SQLITE = """
CREATE TRIGGER usage_events_append_only_{op} BEFORE {op} ON usage_events
BEGIN SELECT RAISE(ABORT, 'usage_events is append-only: add a usage_adjustments row'); END
"""
APPEND_ONLY_POSTGRES_FUNCTION = """
CREATE OR REPLACE FUNCTION usage_events_append_only() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'usage_events is append-only: add a usage_adjustments row'; END
$$ LANGUAGE plpgsql
"""
APPEND_ONLY_POSTGRES_TRIGGER = """
CREATE TRIGGER usage_events_append_only BEFORE UPDATE OR DELETE ON usage_events
FOR EACH ROW EXECUTE FUNCTION usage_events_append_only()
"""


def upgrade() -> None:
    op.create_table(
        "usage_events",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(200), nullable=False, unique=True),
        sa.Column("org_id", sa.String(200), nullable=False),
        sa.Column("key_id", sa.String(200), nullable=False),
        sa.Column("customer_id", sa.String(200)),
        sa.Column("plan", sa.String(100), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("tier", sa.String(20), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("cached_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("list_cost_nano_usd", sa.BigInteger, nullable=False),
        sa.Column("allowance_consumed_nano_usd", sa.BigInteger, nullable=False),
        sa.Column("promotion_multiplier", sa.String(40), nullable=False),
        sa.Column("promotion_id", sa.String(100)),
        sa.Column("price_version", sa.String(100), nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("ended_at", UTCDateTime, nullable=False),
        sa.Column("outcome", sa.String(40), nullable=False),
        sa.Column("recorded_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_usage_events_org_started", "usage_events", ["org_id", "started_at"])
    op.create_index("ix_usage_events_customer", "usage_events", ["customer_id"])
    op.create_table(
        "usage_adjustments",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("adjustment_id", sa.String(200), nullable=False, unique=True),
        sa.Column("org_id", sa.String(200), nullable=False, index=True),
        sa.Column("event_id", sa.String(200)),
        sa.Column("tier", sa.String(20), nullable=False),
        sa.Column("effective_at", UTCDateTime, nullable=False),
        sa.Column("list_cost_delta_nano_usd", sa.BigInteger, nullable=False),
        sa.Column("allowance_delta_nano_usd", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
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
            "event_id",
            sa.String(200),
            sa.ForeignKey("usage_events.event_id"),
            primary_key=True,
        ),
        sa.Column("batch", sa.String(100), nullable=False, index=True),
    )
    op.create_table(
        "stripe_webhook_events",
        sa.Column("event_id", sa.String(200), primary_key=True),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("received_at", UTCDateTime, nullable=False),
    )
    op.create_table(
        "org_suspensions",
        sa.Column("org_id", sa.String(200), primary_key=True),
        sa.Column("customer_id", sa.String(200)),
        sa.Column("suspended", sa.Boolean, nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND_ONLY_POSTGRES_FUNCTION)
        op.execute(APPEND_ONLY_POSTGRES_TRIGGER)
    else:
        op.execute(APPEND_ONLY_SQLITE.format(op="UPDATE"))
        op.execute(APPEND_ONLY_SQLITE.format(op="DELETE"))


def downgrade() -> None:
    for table in (
        "org_suspensions",
        "stripe_webhook_events",
        "stripe_reported_usage",
        "stripe_meter_events",
        "usage_adjustments",
        "usage_events",
    ):
        op.drop_table(table)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS usage_events_append_only()")
