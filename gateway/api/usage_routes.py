"""``GET /v1/usage`` and the receipts under it: what an API key may read of its org's billing.

- ``/v1/usage?start=&end=``: usage and money by day and tier (dates, ``YYYY-MM-DD``);
  with ``group_by=model``, by day, tier and model.
- ``/v1/usage/requests``: one receipt per request, in the order the allowance takes them,
  ``limit`` (1 to 1000, default 100) at a time after the receipt ``after``; filters
  ``start_time`` and ``end_time`` (Unix seconds, start inclusive, end exclusive),
  ``key_id``, ``tier``, ``model``.
- ``/v1/usage/requests/{id}``: one receipt, by request id, response id or the client's
  own ``x-request-id``.
- ``/v1/usage/requests.csv?period=YYYY-MM``: a month's receipts as CSV.

Every query is the calling key's org's: another org's request is a 404 like one that does
not exist. The receipts and their fields are billing's (``billing.ledger.receipts``); this module
parses the query and maps billing's refusals to OpenAI's error body.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from billing.contract import (
    MAX_RECEIPTS_PER_PAGE,
    RECEIPTS_PATH,
    BadReceiptQuery,
    ReceiptNotUnique,
    ReceiptQuery,
    UsageReader,
    UsageUnavailable,
    period_bounds,
)
from gateway.access.auth import Authenticator
from gateway.errors import GatewayError, bad_request
from serving.vocabulary import TIERS

logger = logging.getLogger(__name__)

#: Every read route answers HEAD as GET without a body (uvicorn drops it), auth included.
READ_METHODS = ["GET", "HEAD"]
#: Ids, cursors, key ids and model names are short: anything longer names nothing.
MAX_ID_LENGTH = 200
#: Unix seconds up to the year 9999.
MAX_UNIX_SECONDS = 253_402_300_799


def add_usage_routes(app: FastAPI, auth: Authenticator, usage: UsageReader) -> None:
    @app.api_route("/v1/usage", methods=READ_METHODS)
    async def usage_summary(request: Request) -> JSONResponse:
        principal = await auth.authenticate(request.headers.get("authorization"))
        start = parse_date(request.query_params.get("start"), "start")
        end = parse_date(request.query_params.get("end"), "end")
        if start and end and start > end:
            raise bad_request("start: must not be after end", param="start")
        group_by = request.query_params.get("group_by")
        if group_by not in (None, "model"):
            raise bad_request("group_by: the one grouping offered is 'model'", param="group_by")
        try:
            summary = await usage.usage_summary(
                principal.key.org_id, start, end, by_model=group_by == "model"
            )
        except UsageUnavailable as exc:
            raise unavailable(exc) from None
        return JSONResponse(summary)

    @app.api_route(RECEIPTS_PATH, methods=READ_METHODS)
    async def receipts(request: Request) -> JSONResponse:
        principal = await auth.authenticate(request.headers.get("authorization"))
        query = receipt_query(request)
        try:
            page = await usage.receipts(principal.key.org_id, query)
        except BadReceiptQuery as exc:
            raise bad_request(str(exc), param=exc.param) from None
        except UsageUnavailable as exc:
            raise unavailable(exc) from None
        return JSONResponse(page)

    @app.api_route(f"{RECEIPTS_PATH}.csv", methods=READ_METHODS)
    async def receipts_csv(request: Request) -> Response:
        principal = await auth.authenticate(request.headers.get("authorization"))
        period = request.query_params.get("period") or ""
        try:
            period_bounds(period)
        except ValueError as exc:
            raise bad_request(f"period: {exc}", param="period") from None
        chunks = usage.receipts_csv(principal.key.org_id, period)
        try:
            first = await anext(chunks, b"")
        except UsageUnavailable as exc:
            raise unavailable(exc) from None

        async def body() -> AsyncIterator[bytes]:
            yield first
            async for chunk in chunks:
                yield chunk

        filename = f"receipts-{principal.key.org_id}-{period}.csv"
        return StreamingResponse(
            body(),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="{filename}"'},
        )

    @app.api_route(RECEIPTS_PATH + "/{request_id}", methods=READ_METHODS)
    async def receipt(request: Request, request_id: str) -> JSONResponse:
        principal = await auth.authenticate(request.headers.get("authorization"))
        found = None
        if len(request_id) <= MAX_ID_LENGTH:
            try:
                found = await usage.receipt(principal.key.org_id, request_id)
            except ReceiptNotUnique as exc:
                raise GatewayError(409, str(exc), code="ambiguous_request_id") from None
            except UsageUnavailable as exc:
                raise unavailable(exc) from None
        if found is None:
            raise GatewayError(
                404, f"no request {request_id[:MAX_ID_LENGTH]!r} of this org", code="not_found"
            )
        return JSONResponse(found)


def unavailable(exc: UsageUnavailable) -> GatewayError:
    # The reason is for operators (it names commands to run); clients get a retry.
    logger.warning("usage unavailable: %s", exc)
    return GatewayError(
        503,
        "Usage data is temporarily unavailable; retry shortly.",
        type="server_error",
        code="usage_unavailable",
    )


def receipt_query(request: Request) -> ReceiptQuery:
    params = request.query_params
    start = unix_seconds(params.get("start_time"), "start_time")
    end = unix_seconds(params.get("end_time"), "end_time")
    if start and end and start >= end:
        raise bad_request("start_time: must be before end_time", param="start_time")
    tier = params.get("tier") or None
    if tier is not None and tier not in TIERS:
        raise bad_request(f"tier: one of {', '.join(TIERS)}, got {tier[:40]!r}", param="tier")
    raw_limit = params.get("limit") or "100"
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_RECEIPTS_PER_PAGE:
        raise bad_request(f"limit: a whole number from 1 to {MAX_RECEIPTS_PER_PAGE}", param="limit")
    text = {name: params.get(name) or None for name in ("key_id", "model", "after")}
    for name, value in text.items():
        if value is not None and len(value) > MAX_ID_LENGTH:
            raise bad_request(f"{name}: at most {MAX_ID_LENGTH} characters", param=name)
    return ReceiptQuery(
        start=start,
        end=end,
        key_id=text["key_id"],
        tier=tier,
        model=text["model"],
        limit=int(raw_limit),
        after=text["after"],
    )


def unix_seconds(value: str | None, param: str) -> datetime | None:
    if not value:
        return None
    if not value.isdigit() or int(value) > MAX_UNIX_SECONDS:
        raise bad_request(f"{param}: expected Unix seconds, got {value[:40]!r}", param=param)
    return datetime.fromtimestamp(int(value), UTC)


def parse_date(value: str | None, param: str) -> date | None:
    if value is None or value == "":
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise bad_request(
            f"{param}: expected a date as YYYY-MM-DD, got {value[:40]!r}", param=param
        ) from None
