"""Alembic environment for the ledger; the URL and connection come from billing.ledger."""

from __future__ import annotations

from alembic import context

from billing.ledger.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run ledger migrations through billing.ledger.migrate()")
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
