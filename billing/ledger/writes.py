"""Writing the ledger: usage rows deduplicated by event id, and adjustment rows.

Every write also queues the (org, period) it changes for Stripe sync, in the same
transaction, so the sync never has to scan usage to find what changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Insert
from sqlalchemy.dialects import postgresql, sqlite

from billing.ledger.schema import InvoiceChange, UsageAdjustment, UsageRow
from billing.meter.events import UsageEvent
from billing.prices.periods import period_of


def dialect_insert(connection: Connection, table: Any) -> Any:
    """An INSERT with ON CONFLICT support (both ledger dialects spell it the same way)."""
    if connection.dialect.name == "postgresql":
        return postgresql.insert(table)
    if connection.dialect.name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"the ledger supports SQLite and PostgreSQL, not {connection.dialect.name}")


def insert_ignoring_duplicates(connection: Connection, table: Any, key: str) -> Insert:
    return dialect_insert(connection, table).on_conflict_do_nothing(index_elements=[key])  # type: ignore[no-any-return]


def queue_invoice_changes(connection: Connection, changed: set[tuple[str, str]]) -> None:
    """Count a change to each (org, period) invoice; Stripe sync re-plans those periods."""
    if not changed:
        return
    statement = dialect_insert(connection, InvoiceChange.__table__)
    statement = statement.on_conflict_do_update(
        index_elements=["org_id", "period"],
        set_={"changes": InvoiceChange.__table__.c.changes + 1},
    )
    # Sorted, so concurrent writers lock the rows in one order and cannot deadlock.
    connection.execute(
        statement,
        [{"org_id": org, "period": period, "changes": 1} for org, period in sorted(changed)],
    )


def usage_row_values(event: UsageEvent, recorded_at: datetime) -> dict[str, Any]:
    values = event.model_dump(exclude={"schema_version"})
    values["recorded_at"] = recorded_at
    return values


def insert_usage_events(connection: Connection, events: Sequence[UsageEvent]) -> int:
    """Insert the events not yet in the ledger; returns how many rows were new.

    Redelivery (a reclaimed stream entry, a replayed spool) is normal, so a duplicate
    event id is skipped, never an error and never an update.
    """
    if not events:
        return 0
    now = datetime.now(UTC)
    statement = insert_ignoring_duplicates(connection, UsageRow.__table__, "event_id")
    # rowcount is unreliable for batched inserts (psycopg reports -1); RETURNING is exact.
    result = connection.execute(
        statement.returning(UsageRow.event_id), [usage_row_values(e, now) for e in events]
    )
    inserted = {row.event_id for row in result.all()}
    queue_invoice_changes(
        connection,
        {(e.org_id, period_of(e.started_at)) for e in events if e.event_id in inserted},
    )
    return len(inserted)


def add_adjustment(
    connection: Connection,
    *,
    adjustment_id: str,
    org_id: str,
    tier: str,
    list_cost_delta_nano_usd: int,
    reason: str,
    event_id: str | None = None,
    effective_at: datetime | None = None,
) -> bool:
    """Record a correction of the amount due (outside the allowance: the invoice adds or
    credits ``list_cost_delta_nano_usd`` as it is); idempotent by ``adjustment_id``.
    Returns whether it was new."""
    now = datetime.now(UTC)
    effective = effective_at or now
    statement = insert_ignoring_duplicates(
        connection, UsageAdjustment.__table__, "adjustment_id"
    ).values(
        adjustment_id=adjustment_id,
        org_id=org_id,
        event_id=event_id,
        tier=tier,
        effective_at=effective,
        list_cost_delta_nano_usd=list_cost_delta_nano_usd,
        reason=reason,
        created_at=now,
    )
    added = connection.execute(statement.returning(UsageAdjustment.adjustment_id)).first()
    if added is None:
        return False
    queue_invoice_changes(connection, {(org_id, period_of(effective))})
    return True
