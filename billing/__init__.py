"""Billing: price book, admission and metering, usage ledger, Stripe.

Public API for the other packages (``billing.meter`` and ``billing.pricing`` may also be
imported directly, as DESIGN.md says):

- ``create_meter(settings=None, *, redis_url=None)``: the real ``Meter`` for the gateway;
- ``webhook_router``: FastAPI router serving ``POST /v1/billing/stripe/webhook``;
- ``BillingSettings``: the package's settings (env prefix ``CSTACK_``).

FastAPI, SQLAlchemy and Stripe load lazily so that importing the contract stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from billing.meter import create_meter
from billing.settings import BillingSettings

if TYPE_CHECKING:
    from fastapi import APIRouter

    webhook_router: APIRouter

__all__ = ["BillingSettings", "create_meter", "webhook_router"]


def __getattr__(name: str) -> Any:
    if name == "webhook_router":
        from billing.http import router

        return router
    raise AttributeError(f"module 'billing' has no attribute {name!r}")
