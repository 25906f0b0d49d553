"""One Stripe invoice item per invoice line, updated in place until its invoice is final.

``stripe_invoice_items`` gains what an item is made of and what Stripe has: its kind
(the line's item, or an adjustment after its invoice was finalized), its tokens and
exact unit price, whether it must be removed, the creation's parameters, Stripe's
confirmed state, the update on its way, and the invoice it was finalized on.

Items already there were each a delta of their line: the first of a line becomes its
item, the later ones adjustments, all with the fields they were posted with, so the
next change of a line updates its last item. Items not yet accepted keep their
creation's exact parameters, so a resend is still replayed by Stripe.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

from billing.ledger.schema import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ITEMS = sa.table(
    "stripe_invoice_items",
    sa.column("id", sa.BigInteger),
    sa.column("org_id", sa.String),
    sa.column("period", sa.String),
    sa.column("line_key", sa.String),
    sa.column("revision", sa.Integer),
    sa.column("customer_id", sa.String),
    sa.column("amount_cents", sa.BigInteger),
    sa.column("description", sa.Text),
    sa.column("status", sa.String),
    sa.column("first_attempt_at", UTCDateTime),
    sa.column("stripe_item_id", sa.String),
    sa.column("kind", sa.String),
    sa.column("create_body", sa.Text),
    sa.column("stripe_state", sa.Text),
)


def _legacy_create_body(row: sa.Row) -> str:  # type: ignore[type-arg]
    """The parameters the previous release posted the item with (amount only), as the
    sync keeps a creation's body (billing/stripe/sync.py)."""
    start = datetime.strptime(row.period, "%Y-%m").replace(tzinfo=UTC)
    end = (start + timedelta(days=32)).replace(day=1)
    params = {
        "customer": row.customer_id,
        "amount": row.amount_cents,
        "currency": "usd",
        "description": row.description,
        "metadata": {
            "cstack_org": row.org_id,
            "cstack_period": row.period,
            "cstack_line": row.line_key,
            "cstack_revision": str(row.revision),
        },
        "period": {
            "start": int(start.timestamp()),
            "end": int((end - timedelta(seconds=1)).timestamp()),
        },
    }
    return json.dumps({"params": params, "tokens": None}, sort_keys=True)


def upgrade() -> None:
    with op.batch_alter_table("stripe_invoice_items") as batch:
        batch.add_column(sa.Column("kind", sa.String(20), nullable=False, server_default="line"))
        batch.add_column(sa.Column("quantity", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("unit_amount_decimal", sa.String(40), nullable=True))
        batch.add_column(
            sa.Column("removal", sa.Boolean, nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("create_body", sa.Text, nullable=True))
        batch.add_column(sa.Column("stripe_state", sa.Text, nullable=True))
        batch.add_column(sa.Column("update_body", sa.Text, nullable=True))
        batch.add_column(sa.Column("update_seq", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("invoice_id", sa.String(100), nullable=True))
    bind = op.get_bind()
    bind.execute(ITEMS.update().where(ITEMS.c.revision > 1).values(kind="adjustment"))
    for row in bind.execute(sa.select(ITEMS)).all():
        values: dict[str, str] = {}
        if row.first_attempt_at is not None:
            values["create_body"] = _legacy_create_body(row)
        if row.stripe_item_id is not None:
            state = {"amount": row.amount_cents, "quantity": None, "tokens": None,
                     "unit_amount_decimal": None, "description": row.description}  # fmt: skip
            values["stripe_state"] = json.dumps(state, sort_keys=True)
        if values:
            bind.execute(ITEMS.update().where(ITEMS.c.id == row.id).values(**values))


def downgrade() -> None:
    with op.batch_alter_table("stripe_invoice_items") as batch:
        for column in (
            "invoice_id",
            "update_seq",
            "update_body",
            "stripe_state",
            "create_body",
            "removal",
            "unit_amount_decimal",
            "quantity",
            "kind",
        ):
            batch.drop_column(column)
