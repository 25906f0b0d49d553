"""The real ``UsageReader`` (billing.ledger.reporting): an org's usage and receipts from the ledger.

It only queries: a schema change belongs to `cstack billing migrate` (the billing worker
runs it when it starts), never to a request. Until the schema is there (or while it is
older than this release), and while the database is unreachable, it raises
``UsageUnavailable`` with what an operator should do. Queries run in worker threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import inspect, select
from sqlalchemy.exc import SQLAlchemyError

from billing.ledger import (
    OrgSuspension,
    UsageAdjustment,
    UsageRow,
    make_engine,
    schema_is_current,
)
from billing.ledger.invoice import read_invoice
from billing.ledger.receipts import final_before, find_receipt, list_receipts, month_csv
from billing.ledger.reporting import ReceiptQuery, UsageUnavailable
from billing.ledger.summary import key_activity, usage_summary
from billing.prices.money import format_cents, format_nano_usd
from billing.prices.pricebook import PriceBook
from billing.prices.pricing import pricebook_from_path

T = TypeVar("T")


class LedgerUsageReader:
    TABLES = (UsageRow.__tablename__, UsageAdjustment.__tablename__)

    def __init__(
        self, ledger_url: str, pricebook_path: Path, *, invoice_grace_s: int = 3600
    ) -> None:
        # No connection yet: SQLAlchemy connects on the first query.
        self._engine = make_engine(ledger_url)
        self._pricebook_path = pricebook_path
        self._grace_s = invoice_grace_s

    async def usage_summary(
        self,
        org_id: str,
        start: date | None = None,
        end: date | None = None,
        *,
        by_model: bool = False,
    ) -> dict[str, Any]:
        return await asyncio.to_thread(
            self._read,
            lambda book: usage_summary(self._engine, book, org_id, start, end, by_model=by_model),
        )

    async def key_activity(
        self, org_id: str, period: str, key_ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        return await asyncio.to_thread(
            self._read, lambda _book: key_activity(self._engine, org_id, period, key_ids)
        )

    async def receipts(self, org_id: str, query: ReceiptQuery) -> dict[str, Any]:
        def page(book: PriceBook) -> dict[str, Any]:
            with self._engine.connect() as connection:
                return list_receipts(connection, book, org_id, query, self._final_before())

        return await asyncio.to_thread(self._read, page)

    async def receipt(self, org_id: str, request_id: str) -> dict[str, Any] | None:
        def one(book: PriceBook) -> dict[str, Any] | None:
            with self._engine.connect() as connection:
                return find_receipt(connection, book, org_id, request_id, self._final_before())

        return await asyncio.to_thread(self._read, one)

    async def receipts_csv(self, org_id: str, period: str) -> AsyncIterator[bytes]:
        chunks: Iterator[str] = await asyncio.to_thread(
            self._read,
            lambda book: month_csv(self._engine, book, org_id, period, self._final_before()),
        )
        while True:
            chunk = await asyncio.to_thread(self._read, lambda _book: next(chunks, None))
            if chunk is None:
                return
            yield chunk.encode()

    async def account(self, org_id: str, plan: str) -> dict[str, Any]:
        def read(book: PriceBook) -> dict[str, Any]:
            with self._engine.connect() as connection:
                suspended = connection.execute(
                    select(OrgSuspension.suspended).where(OrgSuspension.org_id == org_id)
                ).scalar()
            terms = book.plans.get(plan)
            return {
                "object": "account",
                "org_id": org_id,
                "plan": None
                if terms is None
                else {
                    "name": terms.name,
                    "included_nano_usd": terms.included_nano,
                    "included": format_nano_usd(terms.included_nano),
                    "overage_billed": terms.overage_billed,
                    "overage_budget_nano_usd": terms.overage_budget_nano,
                    "overage_budget": format_nano_usd(terms.overage_budget_nano),
                    "rpm": terms.rpm,
                    "tpm": terms.tpm,
                },
                "suspended": bool(suspended),
            }

        return await asyncio.to_thread(self._read, read)

    async def invoice_preview(self, org_id: str, period: str) -> dict[str, Any]:
        def read(book: PriceBook) -> dict[str, Any]:
            with self._engine.connect() as connection:
                preview = read_invoice(connection, book, org_id, period)
            return {
                "object": "invoice_preview",
                "org_id": org_id,
                "period": period,
                "plan": preview.plan,
                "currency": "usd",
                "lines": [
                    {
                        "key": line.key,
                        "description": line.description,
                        "quantity": line.quantity,
                        "amount_cents": line.amount_cents,
                        "amount": format_cents(line.amount_cents),
                    }
                    for line in preview.lines
                ],
                "total_cents": preview.total_cents,
                "total": format_cents(preview.total_cents),
                "metered": True,
            }

        return await asyncio.to_thread(self._read, read)

    def _final_before(self) -> datetime:
        return final_before(datetime.now(UTC), self._grace_s)

    def _read(self, query: Callable[[PriceBook], T]) -> T:
        try:
            return query(pricebook_from_path(self._pricebook_path))
        except SQLAlchemyError as exc:
            reason = self._unavailable_reason()
            if reason is None:
                raise  # the schema is there and the database answers: a bug, not an outage
            raise UsageUnavailable(reason) from exc

    def _unavailable_reason(self) -> str | None:
        """Why the ledger cannot answer when an operator has something to fix, else None."""
        try:
            inspector = inspect(self._engine)
            missing = [name for name in self.TABLES if not inspector.has_table(name)]
            current = not missing and schema_is_current(self._engine)
        except SQLAlchemyError as exc:
            # The driver's message may contain the URL (with a password): its type only.
            return f"the usage ledger is unreachable ({type(exc).__name__}); retry shortly"
        if missing:
            return (
                "the usage ledger has no schema yet; run `cstack billing migrate` (the "
                "billing worker does when it starts)"
            )
        if not current:
            return (
                "the usage ledger's schema is older than this release; run `cstack billing "
                "migrate` (the billing worker does when it starts)"
            )
        return None

    async def aclose(self) -> None:
        self._engine.dispose()
