"""Org suspensions follow Stripe's event order, not the order events arrive in.

Adds the creation time of the Stripe event that set each org's suspension state: an event
created before it (a late ``invoice.payment_failed`` after the org has paid) no longer
changes the state. Existing rows keep NULL: any event may set them once.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from billing.ledger.schema import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("org_suspensions", sa.Column("event_created_at", UTCDateTime, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("org_suspensions") as batch:  # SQLite cannot drop in place
        batch.drop_column("event_created_at")
