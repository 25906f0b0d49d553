"""The usage ledger (SQL): append-only usage rows, adjustments, Stripe reporting state.

The package re-exports the tables and the engine only: ``billing.ledger.writes`` takes
usage events (``billing.meter.events``), which name the receipts path of
``billing.ledger.reporting``, so re-exporting the writes here would close an import cycle.
"""

from billing.ledger.database import make_engine, migrate, schema_is_current
from billing.ledger.schema import (
    Base,
    InvoiceChange,
    OrgCustomer,
    OrgSuspension,
    StripeInvoiceItem,
    StripeWebhookEvent,
    UsageAdjustment,
    UsageRow,
)

__all__ = [
    "Base",
    "InvoiceChange",
    "OrgCustomer",
    "OrgSuspension",
    "StripeInvoiceItem",
    "StripeWebhookEvent",
    "UsageAdjustment",
    "UsageRow",
    "make_engine",
    "migrate",
    "schema_is_current",
]
