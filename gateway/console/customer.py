"""The customer console's pages under ``/console`` on the public listener.

An org's developers and finance see this month's spend against the plan, usage per day
(a chart), the receipts (filtered, paged, one at a time, as CSV), the invoice preview of
any month, and the org's keys, limits and default tier. Every figure is what the API
answers (``billing.reporting``'s UsageReader, as ``GET /v1/usage`` and its receipts read
it), always for the session's own org.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from billing.contract import BadReceiptQuery, ReceiptNotUnique, ReceiptQuery
from gateway.console.access import PREFIX, Access, Viewer
from gateway.console.rendering import month_days, recent_months, this_month
from serving.vocabulary import TIERS

#: Page sizes a viewer may pick for the receipts table.
PAGE_SIZES = (25, 50, 100)
#: Ids and filter values longer than this name nothing.
MAX_ID_LENGTH = 200
NAV = [
    ("overview", "Overview"),
    ("usage", "Usage"),
    ("receipts", "Receipts"),
    ("invoice", "Invoice"),
    ("keys", "Keys and limits"),
]
SIGN_IN_REASONS = {
    "signed-out": "You have signed out.",
    "revoked": "Your session ended: its API key was revoked.",
    "suspended": "Your session ended: this organization is suspended.",
}


def chosen_month(request: Request) -> str | None:
    """The ``month`` query parameter (``YYYY-MM``; this month without one), None if malformed."""
    month = request.query_params.get("month") or this_month()
    try:
        month_days(month)
    except ValueError:
        return None
    return month


def filter_date(value: str | None) -> date | None:
    try:
        return date.fromisoformat(value) if value else None
    except ValueError:
        return None


def add_customer_routes(app: Starlette, access: Access) -> None:
    pages, usage, store = access.pages, access.usage, access.store

    def render(viewer: Viewer, name: str, status: int = 200, **context: Any) -> Response:
        return pages.render(
            name,
            {
                "prefix": PREFIX,
                "nav": NAV,
                "org": viewer.org,
                "csrf": viewer.session.csrf,
                **context,
            },
            status,
        )

    def not_found(viewer: Viewer, message: str) -> Response:
        return render(viewer, "error.jinja", 404, title="Not found", message=message)

    def bad_request(viewer: Viewer, message: str) -> Response:
        return render(viewer, "error.jinja", 400, title="Bad request", message=message)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/overview", status_code=303)

    async def sign_in_page(request: Request) -> Response:
        reason = SIGN_IN_REASONS.get(request.query_params.get("reason", ""), "")
        return await access.sign_in_form(request, reason)

    async def overview(request: Request, viewer: Viewer) -> Response:
        # As GET /v1/usage without a window: this month so far.
        summary = await usage.usage_summary(viewer.org.org_id)
        totals = summary.get("totals")
        plan = viewer.account["plan"]
        allowance_left = None
        if plan is not None and totals is not None:
            allowance_left = plan["included_nano_usd"] - totals["allowance_used_nano_usd"]
        return render(
            viewer,
            "overview.jinja",
            page="overview",
            summary=summary,
            totals=totals,
            plan=plan,
            allowance_left=allowance_left,
        )

    async def usage_page(request: Request, viewer: Viewer) -> Response:
        month = chosen_month(request)
        if month is None:
            return bad_request(viewer, "month: expected YYYY-MM")
        first, last = month_days(month)
        summary = await usage.usage_summary(viewer.org.org_id, first, last, by_model=True)
        chart = chart_data(summary.get("data", []))
        return render(
            viewer,
            "usage.jinja",
            page="usage",
            month=month,
            months=recent_months(),
            summary=summary,
            chart=chart,
        )

    async def receipts_page(request: Request, viewer: Viewer) -> Response:
        params = request.query_params
        start, end = filter_date(params.get("start")), filter_date(params.get("end"))
        tier = params.get("tier") or None
        if tier is not None and tier not in TIERS:
            return bad_request(viewer, f"tier: one of {', '.join(TIERS)}")
        size = int(params["limit"]) if params.get("limit", "").isdigit() else PAGE_SIZES[0]
        if size not in PAGE_SIZES:
            return bad_request(viewer, f"limit: one of {', '.join(map(str, PAGE_SIZES))}")
        text = {
            name: (params.get(name) or "").strip()[:MAX_ID_LENGTH]
            for name in ("key_id", "model", "after")
        }
        query = ReceiptQuery(
            start=datetime.combine(start, time(0), tzinfo=UTC) if start else None,
            end=datetime.combine(end + timedelta(days=1), time(0), tzinfo=UTC) if end else None,
            key_id=text["key_id"] or None,
            tier=tier,
            model=text["model"] or None,
            limit=size,
            after=text["after"] or None,
        )
        try:
            page = await usage.receipts(viewer.org.org_id, query)
        except BadReceiptQuery as exc:
            return bad_request(viewer, str(exc))
        filters = {
            "start": start.isoformat() if start else "",
            "end": end.isoformat() if end else "",
            "tier": tier or "",
            "key_id": text["key_id"],
            "model": text["model"],
            "limit": str(size),
        }
        kept = {name: value for name, value in filters.items() if value}
        next_url = (
            f"{PREFIX}/receipts?" + urlencode({**kept, "after": page["last_id"]})
            if page["has_more"]
            else None
        )
        first_url = f"{PREFIX}/receipts?" + urlencode(kept) if query.after else None
        return render(
            viewer,
            "receipts.jinja",
            page="receipts",
            receipts=page["data"],
            filters=filters,
            tiers=TIERS,
            sizes=PAGE_SIZES,
            next_url=next_url,
            first_url=first_url,
            months=recent_months(),
        )

    async def receipt_page(request: Request, viewer: Viewer) -> Response:
        request_id = request.path_params["request_id"]
        found = None
        if len(request_id) <= MAX_ID_LENGTH:
            try:
                found = await usage.receipt(viewer.org.org_id, request_id)
            except ReceiptNotUnique as exc:
                return render(viewer, "error.jinja", 409, title="Ambiguous id", message=str(exc))
        if found is None:
            return not_found(viewer, "No request of this organization has that id.")
        return render(viewer, "receipt.jinja", page="receipts", receipt=found)

    async def receipts_csv(request: Request, viewer: Viewer) -> Response:
        month = chosen_month(request)
        if month is None:
            return bad_request(viewer, "month: expected YYYY-MM")
        chunks = usage.receipts_csv(viewer.org.org_id, month)
        first = await anext(chunks, b"")  # UsageUnavailable before the answer starts

        async def body() -> AsyncIterator[bytes]:
            yield first
            async for chunk in chunks:
                yield chunk

        filename = f"receipts-{viewer.org.org_id}-{month}.csv"
        return StreamingResponse(
            body(),
            media_type="text/csv; charset=utf-8",
            headers={
                "content-disposition": f'attachment; filename="{filename}"',
                "cache-control": "no-store",
            },
        )

    async def invoice_page(request: Request, viewer: Viewer) -> Response:
        month = chosen_month(request)
        if month is None:
            return bad_request(viewer, "month: expected YYYY-MM")
        preview = await usage.invoice_preview(viewer.org.org_id, month)
        return render(
            viewer,
            "invoice.jinja",
            page="invoice",
            month=month,
            months=recent_months(),
            invoice=preview,
        )

    async def keys_page(request: Request, viewer: Viewer) -> Response:
        keys = await store.list_keys(viewer.org.org_id)
        return render(
            viewer,
            "keys.jinja",
            page="keys",
            keys=keys,
            month=this_month(),
            activity=await usage.key_activity(
                viewer.org.org_id, this_month(), [key.key_id for key in keys]
            ),
            plan=viewer.account["plan"],
            current_key=viewer.session.key_id,
        )

    app.add_route(PREFIX, home, methods=["GET"])
    app.add_route(f"{PREFIX}/sign-in", sign_in_page, methods=["GET"])
    app.add_route(f"{PREFIX}/sign-in", access.sign_in, methods=["POST"])
    app.add_route(f"{PREFIX}/sign-out", access.sign_out, methods=["POST"])
    app.add_route(f"{PREFIX}/overview", access.page(overview), methods=["GET"])
    app.add_route(f"{PREFIX}/usage", access.page(usage_page), methods=["GET"])
    app.add_route(f"{PREFIX}/receipts", access.page(receipts_page), methods=["GET"])
    app.add_route(f"{PREFIX}/receipts.csv", access.page(receipts_csv), methods=["GET"])
    app.add_route(f"{PREFIX}/receipts/{{request_id}}", access.page(receipt_page), methods=["GET"])
    app.add_route(f"{PREFIX}/invoice", access.page(invoice_page), methods=["GET"])
    app.add_route(f"{PREFIX}/keys", access.page(keys_page), methods=["GET"])


def chart_data(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tier and model, day by day: list cost in dollars and tokens (input + output),
    for plotly."""
    days = sorted({row["date"] for row in rows})
    series: dict[str, dict[str, Any]] = {}
    names = sorted({(row["tier"], row.get("model") or "") for row in rows}, key=_tier_first)
    for tier, model in names:
        by_day = {
            row["date"]: row
            for row in rows
            if row["tier"] == tier and (row.get("model") or "") == model
        }
        series[f"{tier} · {model}" if model else tier] = {
            "cost_usd": [
                by_day[day]["list_cost_nano_usd"] / 1e9 if day in by_day else 0 for day in days
            ],
            "tokens": [
                by_day[day]["prompt_tokens"] + by_day[day]["completion_tokens"]
                if day in by_day
                else 0
                for day in days
            ],
        }
    return {"days": days, "series": series}


def _tier_first(name: tuple[str, str]) -> tuple[int, str]:
    tier, model = name
    return (TIERS.index(tier) if tier in TIERS else len(TIERS), model)
