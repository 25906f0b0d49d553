"""The org owns its Stripe customer: one record per org, set and changed by an admin.

Adds ``org_customers`` and fills it from the ledger: each org's customer is the one named
by its latest usage row that names one (the customer its months went to until now).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from billing.ledger.schema import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BACKFILL = """
INSERT INTO org_customers (org_id, customer_id, updated_at)
SELECT latest.org_id, latest.customer_id, :now
FROM usage_events AS latest
WHERE latest.id = (
    SELECT MAX(named.id) FROM usage_events AS named
    WHERE named.org_id = latest.org_id AND named.customer_id IS NOT NULL
)
"""


def upgrade() -> None:
    op.create_table(
        "org_customers",
        sa.Column("org_id", sa.String(200), primary_key=True),
        sa.Column("customer_id", sa.String(200), nullable=True, index=True),
        sa.Column("updated_at", UTCDateTime, nullable=False),
    )
    now = datetime.now(UTC).replace(tzinfo=None)  # stored naive UTC, as UTCDateTime does
    op.get_bind().execute(sa.text(BACKFILL), {"now": now})


def downgrade() -> None:
    op.drop_table("org_customers")
