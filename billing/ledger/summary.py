"""An org's usage for ``GET /v1/usage``: tokens and money by day and tier (and model, when
asked), from the ledger.

Money follows the promotion rule (billing.allowance), so these figures are the invoice's
and the receipts'. Adjustment rows are shown on the day and tier they take effect on, so
a correction shows up where it applies without rewriting history.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, func, literal, select

from billing.allowance import Split, month_allowance
from billing.ledger import UsageAdjustment, UsageRow
from billing.prices.money import format_nano_usd
from billing.prices.periods import period_bounds, period_of
from billing.prices.pricebook import PriceBook

#: Per bucket: list cost = what the allowance covered + overage; the amount due is the
#: overage plus adjustments.
MONEY_FIELDS = ("list_cost", "allowance_used", "promotion_savings", "overage", "adjustments")
COUNT_FIELDS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")


def _bounds(start: date | None, end: date | None) -> tuple[date, date]:
    """The window, inclusive. Without ``start``: the first of ``end``'s month (of this
    month without either); without ``end``: today, or ``start`` if that is later."""
    today = datetime.now(UTC).date()
    first = start or (end or today).replace(day=1)
    last = end or max(today, first)
    if last < first:
        raise ValueError(f"end ({last}) is before start ({first})")
    return first, last


def _instant(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def _after(day: date) -> datetime:
    """The instant ``day`` ends (the last representable one for the last date)."""
    if day == date.max:
        return datetime.max.replace(tzinfo=UTC)
    return _instant(day + timedelta(days=1))


def _as_date(value: Any) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value)[:10])


def _with_money_strings(bucket: dict[str, Any]) -> dict[str, Any]:
    out = dict(bucket)
    for name in MONEY_FIELDS:
        out[name] = format_nano_usd(bucket[f"{name}_nano_usd"])
    return out


def _empty() -> dict[str, int]:
    return dict.fromkeys((*COUNT_FIELDS, *(f"{m}_nano_usd" for m in MONEY_FIELDS)), 0)


def _add_split(bucket: dict[str, int], taken: Split) -> None:
    bucket["allowance_used_nano_usd"] += taken.allowance_nano
    bucket["promotion_savings_nano_usd"] += taken.promotion_credit_nano
    bucket["overage_nano_usd"] += taken.overage_nano


def _months(connection: Connection, org_id: str, lower: datetime, upper: datetime) -> list[str]:
    """The periods in which ``org_id`` has usage between ``lower`` and ``upper``."""
    first, last = connection.execute(
        select(func.min(UsageRow.started_at), func.max(UsageRow.started_at)).where(
            UsageRow.org_id == org_id, UsageRow.started_at >= lower, UsageRow.started_at < upper
        )
    ).one()
    if first is None:
        return []
    months, period = [], period_of(first)
    while period <= period_of(last):
        months.append(period)
        period = period_of(period_bounds(period)[1])
    return months


def usage_summary(
    engine: Engine,
    book: PriceBook,
    org_id: str,
    start: date | None = None,
    end: date | None = None,
    *,
    by_model: bool = False,
) -> dict[str, Any]:
    """Usage of ``org_id`` from ``start`` to ``end`` inclusive (default: this month so far),
    a row per day and tier, or per day, tier and model (the name each request asked for)
    with ``by_model``.

    Money per day and tier under the promotion rule (billing.allowance): list cost, the
    allowance it used, what the promotion saved (list covered by the allowance minus the
    allowance used), the overage billed at list price, and adjustments. Each month's
    split is the whole month's, in start order, whatever part of it the window shows.
    """
    first, last = _bounds(start, end)
    lower, upper = _instant(first), _after(last)
    day = func.date(UsageRow.started_at)
    model = (UsageRow.model if by_model else literal("")).label("model")
    buckets: dict[tuple[date, str, str], dict[str, int]] = defaultdict(_empty)
    with engine.connect() as connection:
        for period in _months(connection, org_id, lower, upper):
            month = month_allowance(connection, book, org_id, period)
            month_lower, month_upper = period_bounds(period)
            phase = month.phase()
            phase_column = (literal(0) if isinstance(phase, int) else phase).label("phase")
            usage = (
                select(
                    day.label("day"),
                    UsageRow.tier,
                    model,
                    phase_column,
                    func.count().label("requests"),
                    func.sum(UsageRow.prompt_tokens).label("prompt_tokens"),
                    func.sum(UsageRow.cached_tokens).label("cached_tokens"),
                    func.sum(UsageRow.completion_tokens).label("completion_tokens"),
                    func.sum(UsageRow.list_cost_nano_usd).label("list_cost"),
                    func.sum(UsageRow.allowance_cost_nano_usd).label("allowance_cost"),
                )
                .where(UsageRow.org_id == org_id)
                .where(UsageRow.started_at >= max(lower, month_lower))
                .where(UsageRow.started_at < min(upper, month_upper))
                .group_by(day, UsageRow.tier, model, phase_column)
            )
            for row in connection.execute(usage):
                bucket = buckets[(_as_date(row.day), row.tier, row.model)]
                for name in COUNT_FIELDS:
                    bucket[name] += int(getattr(row, name) or 0)
                list_cost = int(row.list_cost or 0)
                bucket["list_cost_nano_usd"] += list_cost
                if row.phase == 0:
                    _add_split(bucket, Split(int(row.allowance_cost or 0), list_cost, 0))
                elif row.phase == 1 and month.crossing is not None:
                    _add_split(bucket, month.crossing.split)
                else:
                    _add_split(bucket, Split(0, 0, list_cost))
        adjustment_day = func.date(UsageAdjustment.effective_at)
        # An adjustment counts under the model of the request it corrects, if it names one.
        adjusted_model = (func.coalesce(UsageRow.model, "") if by_model else literal("")).label(
            "model"
        )
        adjustments = (
            select(
                adjustment_day.label("day"),
                UsageAdjustment.tier,
                adjusted_model,
                func.sum(UsageAdjustment.list_cost_delta_nano_usd).label("amount"),
            )
            .select_from(UsageAdjustment)
            .outerjoin(
                UsageRow,
                (UsageRow.event_id == UsageAdjustment.event_id)
                & (UsageRow.org_id == UsageAdjustment.org_id),
            )
            .where(UsageAdjustment.org_id == org_id)
            .where(UsageAdjustment.effective_at >= lower, UsageAdjustment.effective_at < upper)
            .group_by(adjustment_day, UsageAdjustment.tier, adjusted_model)
        )
        for row in connection.execute(adjustments):
            key = (_as_date(row.day), row.tier, row.model)
            buckets[key]["adjustments_nano_usd"] += int(row.amount or 0)
    totals = _empty()
    data = []
    for (day_value, tier, model_name), bucket in sorted(buckets.items()):
        for name, value in bucket.items():
            totals[name] += value
        row_key: dict[str, Any] = {"date": day_value.isoformat(), "tier": tier}
        if by_model:
            row_key["model"] = model_name or None
        data.append({**row_key, **_with_money_strings(bucket)})
    return {
        "object": "usage",
        "org_id": org_id,
        "start": first.isoformat(),
        "end": last.isoformat(),
        "currency": "usd",
        "metered": True,
        "totals": _with_money_strings(totals),
        "data": data,
    }


def key_activity(
    engine: Engine, org_id: str, period: str, key_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Per key of ``key_ids`` (``org_id``'s) that has made a request: when it last did, and
    its requests and list cost in ``period`` (``YYYY-MM``). A key with no request is absent.

    Bounded reads whatever the org's history: the month's rows (by org and start), and
    one index lookup per key for its last request."""
    month_lower, month_upper = period_bounds(period)
    month = (
        select(
            UsageRow.key_id,
            func.count().label("requests"),
            func.sum(UsageRow.list_cost_nano_usd).label("list_cost"),
        )
        .where(UsageRow.org_id == org_id)
        .where(UsageRow.started_at >= month_lower, UsageRow.started_at < month_upper)
        .group_by(UsageRow.key_id)
    )
    activity: dict[str, dict[str, Any]] = {}
    with engine.connect() as connection:
        in_month = {row.key_id: row for row in connection.execute(month)}
        for key_id in key_ids:
            last = connection.execute(
                select(func.max(UsageRow.started_at)).where(
                    UsageRow.org_id == org_id, UsageRow.key_id == key_id
                )
            ).scalar()
            if last is None:
                continue
            row = in_month.get(key_id)
            cost = int(row.list_cost or 0) if row else 0
            activity[key_id] = {
                "last_used_at": last.isoformat(),
                "requests": int(row.requests) if row else 0,
                "list_cost_nano_usd": cost,
                "list_cost": format_nano_usd(cost),
            }
    return activity
