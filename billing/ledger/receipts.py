"""Receipts: every request's usage line as its org can check it, from the ledger.

A receipt shows what the request used (input tokens, of them cached, output tokens, of
them reasoning), the tier that served it, the price version and unit prices it was priced
at, its list cost, the promotion that applied and its multiplier, and how the month's
allowance took it under the promotion rule (billing.allowance): allowance consumed, the
list cost that covered, the promotion's credit, and the overage billed at list price. All
money is integer nano-USD. The receipts of a month add up exactly to its invoice's lines
in nano-USD (the invoice rounds each line to cents once): usage lines to the list costs
by tier, direction and version, the allowance line to the allowance consumed, the
promotion line to the promotion credits, the amount due to the overage (plus the
month's adjustments, which are not requests).

A receipt is ``final`` once its month has been over for the Stripe grace: until then a
request that started earlier but reaches the ledger later can still move the point where
the allowance ran out (billing.allowance).

Receipts are listed in the order the allowance takes them (start time, then ledger row),
a page at a time with a cursor (``after``: the last receipt's id), and found one at a time
by the request id (``x-request-id`` when the client sent none), by the response ``id``
(``chatcmpl-…``, ``cmpl-…``, ``resp_…``: each names its request id), or by the client's
own ``x-request-id``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, and_, or_, select

from billing.allowance import MonthAllowance, month_allowance
from billing.ledger import UsageRow
from billing.ledger.reporting import BadReceiptQuery, ReceiptNotUnique, ReceiptQuery
from billing.prices.periods import period_bounds, period_of
from billing.prices.pricebook import PriceBook, PriceVersion

#: Response id prefixes that name the request id after them (vLLM's, from the request id
#: the gateway sends it), and the Responses API's, which names it without its ``req_``.
RESPONSE_PREFIXES = ("chatcmpl-", "cmpl-")
CSV_COLUMNS = (
    "id",
    "x_request_id",
    "started_at",
    "ended_at",
    "outcome",
    "key_id",
    "model",
    "tier",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "price_version",
    "list_cost_nano_usd",
    "promotion_id",
    "usage_multiplier",
    "allowance_cost_nano_usd",
    "allowance_consumed_nano_usd",
    "promotion_credit_nano_usd",
    "overage_nano_usd",
    "final",
)
CSV_PAGE = 1000


class Months:
    """Each month's allowance, read once per page (a page may span two months)."""

    def __init__(self, connection: Connection, book: PriceBook, org_id: str) -> None:
        self._connection, self._book, self._org_id = connection, book, org_id
        self._months: dict[str, MonthAllowance] = {}

    def of(self, started_at: datetime) -> MonthAllowance:
        period = period_of(started_at)
        if period not in self._months:
            self._months[period] = month_allowance(
                self._connection, self._book, self._org_id, period
            )
        return self._months[period]


def _unit_prices(version: PriceVersion | None, tier: str) -> dict[str, int] | None:
    if version is None or tier not in version.tiers:
        return None
    prices = version.tiers[tier]  # type: ignore[index]
    return {"input": prices.input, "cached_input": prices.cached_input, "output": prices.output}


def receipt(
    row: Row[Any], months: Months, book: PriceBook, final_before: datetime
) -> dict[str, Any]:
    """One usage row as its receipt (``final_before``: months ending by then are final)."""
    month = months.of(row.started_at)
    taken = month.split_of(
        row.started_at, row.id, row.list_cost_nano_usd, row.allowance_cost_nano_usd
    )
    versions = {version.version: version for version in book.versions}
    promotion = (
        {"id": row.promotion_id, "usage_multiplier": row.promotion_multiplier}
        if row.promotion_id
        else None
    )
    return {
        "object": "usage.request",
        "id": row.event_id,
        "x_request_id": row.client_request_id,
        "period": month.period,
        "started_at": row.started_at.isoformat(),
        "ended_at": row.ended_at.isoformat(),
        "outcome": row.outcome,
        "key_id": row.key_id,
        "model": row.model,
        "tier": row.tier,
        "input_tokens": row.prompt_tokens,
        "cached_input_tokens": row.cached_tokens,
        "output_tokens": row.completion_tokens,
        "reasoning_tokens": row.reasoning_tokens,
        "price_version": row.price_version,
        "unit_prices_nano_usd": _unit_prices(versions.get(row.price_version), row.tier),
        "list_cost_nano_usd": row.list_cost_nano_usd,
        "promotion": promotion,
        "allowance_cost_nano_usd": row.allowance_cost_nano_usd,
        "allowance_consumed_nano_usd": taken.allowance_nano,
        "promotion_credit_nano_usd": taken.promotion_credit_nano,
        "overage_nano_usd": taken.overage_nano,
        "final": period_bounds(month.period)[1] <= final_before,
    }


def _filters(org_id: str, query: ReceiptQuery) -> list[Any]:
    where: list[Any] = [UsageRow.org_id == org_id]
    if query.start is not None:
        where.append(UsageRow.started_at >= query.start)
    if query.end is not None:
        where.append(UsageRow.started_at < query.end)
    if query.key_id is not None:
        where.append(UsageRow.key_id == query.key_id)
    if query.tier is not None:
        where.append(UsageRow.tier == query.tier)
    if query.model is not None:
        where.append(UsageRow.model == query.model)
    return where


def _after(connection: Connection, org_id: str, receipt_id: str) -> Any:
    """Rows after the receipt ``receipt_id`` in allowance order."""
    cursor = connection.execute(
        select(UsageRow.started_at, UsageRow.id).where(
            UsageRow.org_id == org_id, UsageRow.event_id == receipt_id
        )
    ).first()
    if cursor is None:
        raise BadReceiptQuery(f"after: no receipt {receipt_id!r}", param="after")
    return or_(
        UsageRow.started_at > cursor.started_at,
        and_(UsageRow.started_at == cursor.started_at, UsageRow.id > cursor.id),
    )


def list_receipts(
    connection: Connection,
    book: PriceBook,
    org_id: str,
    query: ReceiptQuery,
    final_before: datetime,
) -> dict[str, Any]:
    """A page of receipts, OpenAI's list shape (``has_more``, ``first_id``, ``last_id``)."""
    where = _filters(org_id, query)
    if query.after is not None:
        where.append(_after(connection, org_id, query.after))
    rows = connection.execute(
        select(UsageRow)
        .where(*where)
        .order_by(UsageRow.started_at, UsageRow.id)
        .limit(query.limit + 1)
    ).all()
    months = Months(connection, book, org_id)
    data = [receipt(row, months, book, final_before) for row in rows[: query.limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > query.limit,
    }


def request_ids_of(wanted: str) -> list[str]:
    """The request ids ``wanted`` may name: itself, and the one a response id names."""
    ids = [wanted]
    for prefix in RESPONSE_PREFIXES:
        if wanted.startswith(prefix):
            ids.append(wanted.removeprefix(prefix))
    if wanted.startswith("resp_"):
        ids.append("req_" + wanted.removeprefix("resp_"))
    return ids


def find_receipt(
    connection: Connection, book: PriceBook, org_id: str, wanted: str, final_before: datetime
) -> dict[str, Any] | None:
    """The receipt ``wanted`` names, of ``org_id`` only (None: none); raises
    ``ReceiptNotUnique`` when it is a client's ``x-request-id`` used more than once."""
    row = connection.execute(
        select(UsageRow).where(
            UsageRow.org_id == org_id, UsageRow.event_id.in_(request_ids_of(wanted))
        )
    ).first()
    if row is None:
        matches = connection.execute(
            select(UsageRow)
            .where(UsageRow.org_id == org_id, UsageRow.client_request_id == wanted)
            .limit(2)
        ).all()
        if len(matches) > 1:
            raise ReceiptNotUnique(
                f"several requests carry x-request-id {wanted!r}; ask by the request's id "
                "or its response id"
            )
        row = matches[0] if matches else None
    if row is None:
        return None
    return receipt(row, Months(connection, book, org_id), book, final_before)


#: A spreadsheet runs a cell that starts with one of these as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A CSV cell: empty for None; the one free-form text (a client's ``x-request-id``)
    is kept from reading as a spreadsheet formula by a leading apostrophe."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def month_csv(
    engine: Engine, book: PriceBook, org_id: str, period: str, final_before: datetime
) -> Iterator[str]:
    """A month's receipts as CSV (a header, then a row each in allowance order), a page of
    rows per chunk, each page read in its own connection."""
    lower, upper = period_bounds(period)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)  # with the first page: a failure comes before any byte
    query = ReceiptQuery(start=lower, end=upper, limit=CSV_PAGE)
    while True:
        with engine.connect() as connection:
            page = list_receipts(connection, book, org_id, query, final_before)
        for item in page["data"]:
            promotion = item["promotion"] or {}
            values = {
                **item,
                "promotion_id": promotion.get("id"),
                "usage_multiplier": promotion.get("usage_multiplier", "1"),
            }
            writer.writerow([csv_cell(values[c]) for c in CSV_COLUMNS])
        yield out.getvalue()
        out.seek(0)
        out.truncate()
        if not page["has_more"]:
            return
        query = ReceiptQuery(start=lower, end=upper, limit=CSV_PAGE, after=page["last_id"])


def final_before(now: datetime, grace_s: int) -> datetime:
    """Receipts of months that ended by this instant are final: no usage of them can
    still arrive (the Stripe grace: ``CSTACK_STRIPE_INVOICE_GRACE_S``)."""
    return now - timedelta(seconds=grace_s)
