"""Billing's accounts contract with the gateway: which Stripe customer an org's invoices go to.

The org owns its Stripe customer: the gateway's admin API and `cstack keys customer` set
and change it here, and every invoice item of a month goes to it. The gateway keeps a
copy on the org's record in Redis, which admission reads to refuse an org whose
customer Stripe has suspended. Like ``billing.meter.protocol`` this module imports nothing from
billing; the real one comes from ``billing.contract.create_accounts``.
"""

from __future__ import annotations

import re
from typing import Protocol

#: A Stripe customer id (``cus_`` and letters, digits or underscores).
CUSTOMER_ID = re.compile(r"^cus_[A-Za-z0-9_]{1,200}\Z")


class AccountsUnavailable(Exception):
    """The record of orgs' customers cannot be written now (the ledger is down...)."""


def check_customer_id(customer_id: str) -> None:
    """Raise ``ValueError`` naming the problem unless ``customer_id`` is a Stripe customer id."""
    if not CUSTOMER_ID.match(customer_id):
        raise ValueError(
            f"invalid Stripe customer id {customer_id[:60]!r}: expected cus_ and letters or digits"
        )


class BillingAccounts(Protocol):
    async def set_customer(self, org_id: str, customer_id: str | None) -> None:
        """``org_id``'s invoices go to ``customer_id`` from now on (None: to no one, which
        keeps its usage from Stripe until it has one again); raises ``ValueError`` for a
        malformed id, ``AccountsUnavailable`` when it cannot be recorded."""
        ...

    async def aclose(self) -> None: ...


class UnbilledAccounts:
    """Records nothing: the gateway with billing switched off (nothing goes to Stripe)."""

    async def set_customer(self, org_id: str, customer_id: str | None) -> None:
        if customer_id is not None:
            check_customer_id(customer_id)

    async def aclose(self) -> None:
        return None
