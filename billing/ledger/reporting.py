"""Billing's reporting contract with the gateway: an org's usage for ``GET /v1/usage`` and
its receipts, one per request, for ``GET /v1/usage/requests``; its plan's terms, its
suspension and its invoice preview for the console (gateway.console).

Kept apart from ``billing.meter.protocol`` (the request path) because it reads the SQL ledger,
which admission and settlement never touch. Like that module it imports nothing from
billing; the real reader comes from ``billing.contract.create_usage_reader``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Protocol

#: The most receipts one page holds.
MAX_RECEIPTS_PER_PAGE = 1000
#: Where an org reads its receipts (``GET``; one request's at ``/{request id}``).
RECEIPTS_PATH = "/v1/usage/requests"


class UsageUnavailable(Exception):
    """Usage cannot be read right now (say, the ledger has no schema yet); the gateway
    answers 503 with this message."""


class BadReceiptQuery(ValueError):
    """A receipts query that names something that is not there (its ``param``): 400."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


class ReceiptNotUnique(Exception):
    """An id that names several requests (a client's ``x-request-id`` used twice): 409."""


@dataclass(frozen=True)
class ReceiptQuery:
    """Which receipts, in the order the allowance takes them (start time, then arrival)."""

    #: Requests that started at or after ``start`` and before ``end`` (aware instants).
    start: datetime | None = None
    end: datetime | None = None
    key_id: str | None = None
    tier: str | None = None
    model: str | None = None
    limit: int = 100
    #: The id of the last receipt of the previous page.
    after: str | None = None


class UsageReader(Protocol):
    async def usage_summary(
        self,
        org_id: str,
        start: date | None = None,
        end: date | None = None,
        *,
        by_model: bool = False,
    ) -> dict[str, Any]:
        """``org_id``'s usage from ``start`` to ``end`` inclusive, as ``GET /v1/usage``
        returns it (a row per day and tier, or per day, tier and model with ``by_model``);
        raises ``UsageUnavailable`` when it cannot be read."""
        ...

    async def key_activity(
        self, org_id: str, period: str, key_ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        """Per key of ``key_ids`` (``org_id``'s) that has made a request: ``last_used_at``
        (an ISO 8601 instant), and ``requests`` and ``list_cost`` (and
        ``list_cost_nano_usd``) in ``period`` (``YYYY-MM``)."""
        ...

    async def receipts(self, org_id: str, query: ReceiptQuery) -> dict[str, Any]:
        """A page of ``org_id``'s receipts (OpenAI's list shape); raises
        ``BadReceiptQuery`` or ``UsageUnavailable``."""
        ...

    async def receipt(self, org_id: str, request_id: str) -> dict[str, Any] | None:
        """The receipt of one of ``org_id``'s requests, by its request id, its response
        id or the client's ``x-request-id`` (None: no such request of the org); raises
        ``ReceiptNotUnique`` or ``UsageUnavailable``."""
        ...

    def receipts_csv(self, org_id: str, period: str) -> AsyncIterator[bytes]:
        """A month's receipts as CSV, in chunks (the first one read before any is sent,
        so ``UsageUnavailable`` comes before the answer starts)."""
        ...

    async def account(self, org_id: str, plan: str) -> dict[str, Any]:
        """What the console shows of ``org_id``'s account: ``plan``'s terms in the price
        book (``plan``: None when the book has no such plan) and whether billing has
        suspended the org (its own suspension or its Stripe customer's); raises
        ``UsageUnavailable``."""
        ...

    async def invoice_preview(self, org_id: str, period: str) -> dict[str, Any]:
        """``org_id``'s invoice for ``period`` (``YYYY-MM``) as `cstack billing
        invoice-preview` computes it and Stripe's items mirror it: its lines, each rounded
        to cents once, and their total; raises ``UsageUnavailable``."""
        ...

    async def aclose(self) -> None: ...


class UnmeteredUsageReader:
    """Reports that nothing is metered: the gateway with billing switched off."""

    async def usage_summary(
        self,
        org_id: str,
        start: date | None = None,
        end: date | None = None,
        *,
        by_model: bool = False,
    ) -> dict[str, Any]:
        return {"object": "usage", "org_id": org_id, "data": [], "metered": False}

    async def key_activity(
        self, org_id: str, period: str, key_ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        return {}

    async def receipts(self, org_id: str, query: ReceiptQuery) -> dict[str, Any]:
        return {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}

    async def receipt(self, org_id: str, request_id: str) -> dict[str, Any] | None:
        return None

    async def receipts_csv(self, org_id: str, period: str) -> AsyncIterator[bytes]:
        yield b""

    async def account(self, org_id: str, plan: str) -> dict[str, Any]:
        return {"object": "account", "org_id": org_id, "plan": None, "suspended": False}

    async def invoice_preview(self, org_id: str, period: str) -> dict[str, Any]:
        return {
            "object": "invoice_preview",
            "org_id": org_id,
            "period": period,
            "plan": None,
            "currency": "usd",
            "lines": [],
            "total_cents": 0,
            "total": "$0.00",
            "metered": False,
        }

    async def aclose(self) -> None:
        return None
