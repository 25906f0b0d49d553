"""The usage ledger (SQL): append-only usage rows, adjustments, Stripe reporting state."""

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
from billing.ledger.writes import add_adjustment, insert_usage_events

__all__ = [
    "Base",
    "InvoiceChange",
    "OrgCustomer",
    "OrgSuspension",
    "StripeInvoiceItem",
    "StripeWebhookEvent",
    "UsageAdjustment",
    "UsageRow",
    "add_adjustment",
    "insert_usage_events",
    "make_engine",
    "migrate",
    "schema_is_current",
]
