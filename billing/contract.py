"""Billing as the gateway sees it: the only billing module the gateway imports.

Three contracts, each defined in a leaf module of its domain and re-exported here:

- the meter (``billing.meter.protocol``): admission before forwarding, usage after, on
  the request path; ``AdmissionRequest``, ``Admission``, ``AdmissionRefused``,
  ``UsageReport``;
- usage reading (``billing.ledger.reporting``): an org's usage and receipts, for
  ``GET /v1/usage`` and ``GET /v1/usage/requests``;
- accounts (``billing.stripe.accounts``): which Stripe customer an org's invoices go to,
  for the admin API.

The real implementations are built here from ``BillingSettings`` (env prefix
``CSTACK_``) and imported only when called: they bring Redis, SQLAlchemy and Stripe with
them, and they import the contracts above, so importing them here would close a cycle.
The Redis client helpers and ``period_bounds`` are re-exported because the gateway's key
store and usage routes share them with billing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from billing.ledger.reporting import (
    MAX_RECEIPTS_PER_PAGE,
    RECEIPTS_PATH,
    BadReceiptQuery,
    ReceiptNotUnique,
    ReceiptQuery,
    UnmeteredUsageReader,
    UsageReader,
    UsageUnavailable,
)
from billing.meter.protocol import (
    Admission,
    AdmissionRefused,
    AdmissionRequest,
    Meter,
    Outcome,
    UnmeteredMeter,
    UsageReport,
)
from billing.prices.periods import period_bounds
from billing.redis.client import (
    REDIS_FAILURES,
    AsyncClient,
    RedisUrlError,
    async_client,
    connect_early,
    sync_client,
)
from billing.settings import BillingSettings
from billing.stripe.accounts import (
    AccountsUnavailable,
    BillingAccounts,
    UnbilledAccounts,
    check_customer_id,
)

if TYPE_CHECKING:
    from fastapi import APIRouter

__all__ = [
    "MAX_RECEIPTS_PER_PAGE",
    "RECEIPTS_PATH",
    "REDIS_FAILURES",
    "AccountsUnavailable",
    "Admission",
    "AdmissionRefused",
    "AdmissionRequest",
    "AsyncClient",
    "BadReceiptQuery",
    "BillingAccounts",
    "BillingSettings",
    "Meter",
    "Outcome",
    "ReceiptNotUnique",
    "ReceiptQuery",
    "RedisUrlError",
    "UnbilledAccounts",
    "UnmeteredMeter",
    "UnmeteredUsageReader",
    "UsageReader",
    "UsageReport",
    "UsageUnavailable",
    "async_client",
    "check_customer_id",
    "connect_early",
    "create_accounts",
    "create_meter",
    "create_usage_reader",
    "period_bounds",
    "stripe_webhook_router",
    "sync_client",
]


def create_meter(settings: BillingSettings | None = None, *, redis_url: str | None = None) -> Meter:
    """The real Meter (Redis admission and rate limits, usage stream, disk spool).

    ``settings`` defaults to ``BillingSettings()`` (env prefix ``CSTACK_``); ``redis_url``
    overrides its Redis URL, so a caller holding only a URL needs nothing else.
    """
    from billing.meter.redis_meter import RedisMeter

    resolved = settings or BillingSettings()
    if redis_url is not None:
        resolved = resolved.model_copy(update={"redis_url": redis_url})
    return RedisMeter(resolved)


def create_usage_reader(settings: BillingSettings | None = None) -> UsageReader:
    """The real UsageReader: queries the SQL ledger at ``settings.ledger_url``, whose schema
    `cstack billing migrate` (or the billing worker) has created."""
    from billing.ledger.usage_reader import LedgerUsageReader

    resolved = settings or BillingSettings()
    return LedgerUsageReader(
        resolved.ledger_url,
        resolved.pricebook_path,
        invoice_grace_s=resolved.stripe_invoice_grace_s,
    )


def create_accounts(settings: BillingSettings | None = None) -> BillingAccounts:
    """The real BillingAccounts: the ledger's record of each org's Stripe customer."""
    from billing.stripe.customers import LedgerAccounts

    return LedgerAccounts((settings or BillingSettings()).ledger_url)


def stripe_webhook_router() -> APIRouter:
    """The Stripe webhook (``POST /v1/billing/stripe/webhook``), a router the gateway app
    includes when billing is on; its service is built from ``BillingSettings`` on first use."""
    from billing.stripe.router import router

    return router
