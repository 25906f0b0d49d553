"""Billing: price book, admission and metering, usage ledger, Stripe.

The gateway's contracts with billing are three leaf modules: ``billing.meter`` (admission
and settlement, on the request path), ``billing.reporting`` (an org's usage and receipts,
for ``GET /v1/usage``) and ``billing.accounts`` (an org's Stripe customer, for the admin
API). Built from ``BillingSettings`` (env prefix ``CSTACK_``):

- ``create_meter(settings=None, *, redis_url=None)``: the real ``Meter``;
- ``create_usage_reader(settings=None)``: the real ``UsageReader`` (the SQL ledger);
- ``create_accounts(settings=None)``: the real ``BillingAccounts`` (``billing.accounts``:
  each org's Stripe customer, in the ledger).

The Stripe webhook is ``billing.http.router``, a FastAPI router the gateway app includes.
"""

from billing.factory import create_accounts, create_meter, create_usage_reader
from billing.settings import BillingSettings

__all__ = ["BillingSettings", "create_accounts", "create_meter", "create_usage_reader"]
