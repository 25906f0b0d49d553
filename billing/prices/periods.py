"""Billing periods: UTC calendar months, named ``YYYY-MM``.

The one place that says what a period is. The meter names an org's budget keys by the
period (its own clock's, then Redis's), the ledger files each usage event under the period
of its start, and invoices, reconciliation and Stripe read a period back as its bounds.
Nothing here imports beyond the standard library, so the request path and the ledger
both use it.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta


def period_of(at: datetime) -> str:
    """The period an instant (an aware datetime) falls in."""
    return at.astimezone(UTC).strftime("%Y-%m")


def current_period(today: date | None = None) -> str:
    """The period of ``today`` (the UTC date now when not given)."""
    return (today or datetime.now(UTC).date()).strftime("%Y-%m")


def period_bounds(period: str) -> tuple[datetime, datetime]:
    """``YYYY-MM`` -> [first instant, first instant of the next month), in UTC."""
    try:
        first = datetime.strptime(period, "%Y-%m").replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(f"period must look like 2026-11, got {period!r}") from None
    following = (first + timedelta(days=32)).replace(day=1)
    return first, following
