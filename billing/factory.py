"""The objects the gateway gets from billing, built from ``BillingSettings``.

The implementations are imported when called: this module is re-exported by
``billing/__init__``, which every import of a billing contract runs, and they bring Redis
and SQLAlchemy with them.
"""

from __future__ import annotations

from billing.accounts import BillingAccounts
from billing.meter import Meter
from billing.reporting import UsageReader
from billing.settings import BillingSettings


def create_meter(settings: BillingSettings | None = None, *, redis_url: str | None = None) -> Meter:
    """The real Meter (Redis admission and rate limits, usage stream, disk spool).

    ``settings`` defaults to ``BillingSettings()`` (env prefix ``CSTACK_``); ``redis_url``
    overrides its Redis URL, so a caller holding only a URL needs nothing else.
    """
    from billing.redis_meter import RedisMeter

    resolved = settings or BillingSettings()
    if redis_url is not None:
        resolved = resolved.model_copy(update={"redis_url": redis_url})
    return RedisMeter(resolved)


def create_usage_reader(settings: BillingSettings | None = None) -> UsageReader:
    """The real UsageReader: queries the SQL ledger at ``settings.ledger_url``, whose schema
    `cstack billing migrate` (or the billing worker) has created."""
    from billing.usage_reader import LedgerUsageReader

    resolved = settings or BillingSettings()
    return LedgerUsageReader(
        resolved.ledger_url,
        resolved.pricebook_path,
        invoice_grace_s=resolved.stripe_invoice_grace_s,
    )


def create_accounts(settings: BillingSettings | None = None) -> BillingAccounts:
    """The real BillingAccounts: the ledger's record of each org's Stripe customer."""
    from billing.customers import LedgerAccounts

    return LedgerAccounts((settings or BillingSettings()).ledger_url)
