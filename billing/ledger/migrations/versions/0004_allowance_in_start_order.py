"""A promotion multiplies the allowance only: what a usage row stores is its allowance cost.

``usage_events.allowance_consumed_nano_usd`` becomes ``allowance_cost_nano_usd``, with the
same values: list cost / promotion multiplier, what the request takes of the allowance
while enough is left. How much of it the month's allowance covers, and what is overage
at list price, is decided on reading, in start order (billing/allowance.py).

``usage_adjustments.allowance_delta_nano_usd`` is dropped: an adjustment is an amount
added to, or credited from, the amount due, outside the allowance, so its list delta is
all of it and an allowance delta has nothing left to change.

Invoices of months already posted to Stripe are not re-planned by this change: their
Stripe items stand as posted, and `cstack billing reconcile` shows how they differ from
the ledger under the rule.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A rename in place on both dialects (SQLite 3.25+): the append-only triggers stay.
    op.alter_column(
        "usage_events", "allowance_consumed_nano_usd", new_column_name="allowance_cost_nano_usd"
    )
    with op.batch_alter_table("usage_adjustments") as batch:  # SQLite cannot drop in place
        batch.drop_column("allowance_delta_nano_usd")


def downgrade() -> None:
    with op.batch_alter_table("usage_adjustments") as batch:
        batch.add_column(
            sa.Column("allowance_delta_nano_usd", sa.BigInteger, nullable=False, server_default="0")
        )
    op.alter_column(
        "usage_events", "allowance_cost_nano_usd", new_column_name="allowance_consumed_nano_usd"
    )
