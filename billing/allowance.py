"""The promotion rule: how a month's usage splits between the plan's allowance and overage.

A plan includes an allowance in dollars. A promotion (the launch week) multiplies it for
the models it names and nothing else: while it runs, usage counts 1/m against the
allowance (a request's *allowance cost* is its list cost / m, exactly). Usage past the
allowance is overage, billed at list price.

The month's requests take the allowance in the order they started (``started_at``, then
the ledger's row id for requests that started in the same microsecond). Each takes its
allowance cost while that much is left. The request that finds less left than its cost
is split: the rest of the allowance covers ``ceil(rest x m)`` of its list cost (a part
of a nano-USD goes the customer's way), and the remainder of its list cost is overage.
Every later request is overage in full. So:

- allowance consumed = min(included, the month's allowance costs), exactly;
- promotion credit = list cost the allowance covered - allowance consumed;
- amount due for usage = list cost - list cost the allowance covered = the overage.

Where the split is computed, and why there. It is a pure function of the ledger's usage
rows of the month, read from them whenever something needs it (``month_allowance``), and
never stored. Every reader (the invoice and so Stripe, ``GET /v1/usage``, the receipts,
reconciliation) calls this module on the same rows, so they agree at any moment, and no
stored split can go stale. A request that started earlier but reaches the ledger later
(a replayed spool, a dead letter, a settlement delayed past later ones) takes its place
in start order: the crossing point moves earlier, some requests that were inside the
allowance become overage, and every reader follows at once, the invoice included (its
changed lines reach Stripe as any late usage does). Receipts of a month are therefore
final once no usage of it can still arrive: after the month's grace
(``CSTACK_STRIPE_INVOICE_GRACE_S``). The cost is one ordered scan of the org's month per
read, in the database (a window function over the org and time index).

Admission cannot wait for the ledger, so Redis applies the same rule in the order
settlements land (``budget_units``, mirrored by the Lua scripts of ``billing.meter.scripts``): the
allowance fills at allowance cost, then overage counts list dollars against the overage
budget. The two orders differ only for requests in flight across a promotion's start or
end, and admission's budget is a bound, not an invoice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from sqlalchemy import Connection, and_, case, func, or_, select

from billing.ledger import UsageRow
from billing.prices.periods import period_bounds
from billing.prices.pricebook import PriceBook


@dataclass(frozen=True)
class Split:
    """What one request (or a set of them) took of the allowance; integer nano-USD."""

    #: Allowance consumed (allowance dollars: list / multiplier while a promotion runs).
    allowance_nano: int
    #: The list cost that allowance covered.
    covered_nano: int
    #: The list cost billed as overage.
    overage_nano: int

    @property
    def promotion_credit_nano(self) -> int:
        """What the promotion took off: list covered minus allowance consumed."""
        return self.covered_nano - self.allowance_nano

    def __add__(self, other: Split) -> Split:
        return Split(
            self.allowance_nano + other.allowance_nano,
            self.covered_nano + other.covered_nano,
            self.overage_nano + other.overage_nano,
        )


NOTHING = Split(0, 0, 0)


def split(list_cost: int, allowance_cost: int, multiplier: Fraction, left: int) -> Split:
    """One request of ``list_cost`` (``allowance_cost`` = list / ``multiplier``) when
    ``left`` of the allowance is left before it."""
    if left <= 0:
        return Split(0, 0, list_cost)
    if allowance_cost <= left:
        return Split(allowance_cost, list_cost, 0)
    covered = -(-left * multiplier.numerator // multiplier.denominator)
    return Split(left, covered, list_cost - covered)


def budget_units(list_cost: int, multiplier: Fraction, included: int, used: int) -> int:
    """What one request adds to an org's budget in Redis after ``used``: its allowance
    consumed plus its overage (the Lua scripts compute the same)."""
    taken = split(
        list_cost,
        list_cost * multiplier.denominator // multiplier.numerator,
        multiplier,
        included - used,
    )
    return taken.allowance_nano + taken.overage_nano


@dataclass(frozen=True)
class Crossing:
    """The request that found less allowance left than its allowance cost."""

    started_at: datetime
    row_id: int
    split: Split


@dataclass(frozen=True)
class MonthAllowance:
    """An org's month as the rule sees it: its plan, and where the allowance ran out."""

    org_id: str
    period: str
    #: The plan of the month's latest request (None: no usage).
    plan: str | None
    included_nano: int
    #: Where the allowance ran out; None: it did not (every request is inside it).
    crossing: Crossing | None
    #: What the requests before the crossing took (all of the month's when not crossed).
    before: Split

    @property
    def total(self) -> Split:
        """The month's split, every request together."""
        return self.before + (self.crossing.split if self.crossing else NOTHING)

    def split_of(
        self, started_at: datetime, row_id: int, list_cost: int, allowance_cost: int
    ) -> Split:
        """One request's split (a row of this month)."""
        crossing = self.crossing
        if crossing is None or (started_at, row_id) < (crossing.started_at, crossing.row_id):
            return Split(allowance_cost, list_cost, 0)
        if row_id == crossing.row_id:
            return crossing.split
        return Split(0, 0, list_cost)

    def phase(self) -> Any:
        """A SQL expression: 0 for rows before the crossing, 1 the crossing, 2 after."""
        crossing = self.crossing
        if crossing is None:
            return 0
        before = or_(
            UsageRow.started_at < crossing.started_at,
            and_(UsageRow.started_at == crossing.started_at, UsageRow.id < crossing.row_id),
        )
        return case((before, 0), (UsageRow.id == crossing.row_id, 1), else_=2)


def in_month(org_id: str, period: str) -> tuple[Any, ...]:
    """The WHERE clause of an org's usage rows of a period (by start)."""
    lower, upper = period_bounds(period)
    return (UsageRow.org_id == org_id, UsageRow.started_at >= lower, UsageRow.started_at < upper)


def month_allowance(
    connection: Connection, book: PriceBook, org_id: str, period: str
) -> MonthAllowance:
    """The month's split as ``connection`` sees the ledger (see the module docstring)."""
    where = in_month(org_id, period)
    plan = connection.execute(
        select(UsageRow.plan)
        .where(*where)
        .order_by(UsageRow.started_at.desc(), UsageRow.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    included = book.included_nano(plan)
    order = (UsageRow.started_at, UsageRow.id)
    running = (
        select(
            UsageRow.id,
            UsageRow.started_at,
            UsageRow.list_cost_nano_usd,
            UsageRow.allowance_cost_nano_usd,
            UsageRow.promotion_multiplier,
            func.sum(UsageRow.allowance_cost_nano_usd)
            .over(order_by=order, rows=(None, 0))
            .label("allowance_through"),
            func.sum(UsageRow.list_cost_nano_usd)
            .over(order_by=order, rows=(None, 0))
            .label("list_through"),
        )
        .where(*where)
        .subquery()
    )
    row = connection.execute(
        select(running)
        .where(running.c.allowance_through > included)
        .order_by(running.c.started_at, running.c.id)
        .limit(1)
    ).first()
    if row is None:
        totals = connection.execute(
            select(
                func.coalesce(func.sum(UsageRow.allowance_cost_nano_usd), 0),
                func.coalesce(func.sum(UsageRow.list_cost_nano_usd), 0),
            ).where(*where)
        ).one()
        before = Split(int(totals[0]), int(totals[1]), 0)
        return MonthAllowance(org_id, period, plan, included, None, before)
    allowance_before = int(row.allowance_through) - int(row.allowance_cost_nano_usd)
    list_before = int(row.list_through) - int(row.list_cost_nano_usd)
    crossing = Crossing(
        started_at=row.started_at,
        row_id=int(row.id),
        split=split(
            int(row.list_cost_nano_usd),
            int(row.allowance_cost_nano_usd),
            Fraction(row.promotion_multiplier),
            included - allowance_before,
        ),
    )
    before = Split(allowance_before, list_before, 0)
    return MonthAllowance(org_id, period, plan, included, crossing, before)
