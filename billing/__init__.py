"""Billing: price book, admission and metering, usage ledger, Stripe.

The gateway's contracts with billing are two leaf modules: ``billing.meter`` (admission
and settlement, on the request path) and ``billing.reporting`` (an org's usage, for
``GET /v1/usage``). Built from ``BillingSettings`` (env prefix ``CSTACK_``):

- ``create_meter(settings=None, *, redis_url=None)``: the real ``Meter``;
- ``create_usage_reader(settings=None)``: the real ``UsageReader`` (the SQL ledger).

The Stripe webhook is ``billing.http.router``, a FastAPI router the gateway app includes.
"""

from billing.factory import create_meter, create_usage_reader
from billing.settings import BillingSettings

__all__ = ["BillingSettings", "create_meter", "create_usage_reader"]
