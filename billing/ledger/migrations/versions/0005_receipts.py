"""Receipts per request: reasoning tokens and the client's own request id on usage rows.

Adds ``usage_events.reasoning_tokens`` (NULL on the rows already there: not recorded)
and ``usage_events.client_request_id`` (the ``x-request-id`` a client sent, NULL when it
sent none), with the indexes receipts are looked up and filtered by.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("usage_events", sa.Column("reasoning_tokens", sa.BigInteger, nullable=True))
    op.add_column("usage_events", sa.Column("client_request_id", sa.String(128), nullable=True))
    op.create_index(
        "ix_usage_events_org_key_started", "usage_events", ["org_id", "key_id", "started_at"]
    )
    op.create_index(
        "ix_usage_events_org_client_request", "usage_events", ["org_id", "client_request_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_usage_events_org_client_request", "usage_events")
    op.drop_index("ix_usage_events_org_key_started", "usage_events")
    # In place on both dialects (SQLite 3.35+): a batch copy would drop the table's
    # append-only triggers.
    op.execute("ALTER TABLE usage_events DROP COLUMN client_request_id")
    op.execute("ALTER TABLE usage_events DROP COLUMN reasoning_tokens")
