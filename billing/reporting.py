"""Billing's reporting contract with the gateway: an org's usage for ``GET /v1/usage``.

Kept apart from ``billing.meter`` (the request path) because it reads the SQL ledger,
which admission and settlement never touch. Like that module it imports nothing from
billing; the real reader comes from ``billing.create_usage_reader``.
"""

from __future__ import annotations

from datetime import date
from typing import Any, Protocol


class UsageUnavailable(Exception):
    """Usage cannot be read right now (say, the ledger has no schema yet); the gateway
    answers 503 with this message."""


class UsageReader(Protocol):
    async def usage_summary(
        self, org_id: str, start: date | None = None, end: date | None = None
    ) -> dict[str, Any]:
        """``org_id``'s usage from ``start`` to ``end`` inclusive, as ``GET /v1/usage``
        returns it; raises ``UsageUnavailable`` when it cannot be read."""
        ...

    async def aclose(self) -> None: ...


class UnmeteredUsageReader:
    """Reports that nothing is metered: the gateway with billing switched off."""

    async def usage_summary(
        self, org_id: str, start: date | None = None, end: date | None = None
    ) -> dict[str, Any]:
        return {"object": "usage", "org_id": org_id, "data": [], "metered": False}

    async def aclose(self) -> None:
        return None
