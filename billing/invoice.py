"""Invoice preview: the period's lines for an org, each rounded to cents exactly once.

Usage lines show list price per tier and direction; the launch promotion and the included
allowance appear as credits, and what is left is the overage due. Every line is computed
in nano-USD and rounded once; the total is the sum of the rounded lines, as on a real
invoice. Each line has a stable key (``fast.output.2026-11-01``, ``promotion``,
``allowance``, ``adjustments``): Stripe's invoice items mirror the lines by that key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, func, select

from billing.ledger import UsageAdjustment, UsageRow
from billing.money import format_cents, round_to_cents
from billing.periods import period_bounds
from billing.pricebook import PriceBook, PriceBookError

#: Keys of the lines that are not usage (usage lines are ``tier.direction.price_version``).
PROMOTION_LINE = "promotion"
ALLOWANCE_LINE = "allowance"
ADJUSTMENTS_LINE = "adjustments"


@dataclass(frozen=True)
class InvoiceLine:
    #: Stable across recomputations of the same period, whatever the amounts.
    key: str
    description: str
    quantity: int | None
    amount_nano_usd: int

    @property
    def amount_cents(self) -> int:
        return round_to_cents(self.amount_nano_usd)


@dataclass
class InvoicePreview:
    org_id: str
    period: str
    plan: str | None
    lines: list[InvoiceLine] = field(default_factory=list)

    @property
    def total_cents(self) -> int:
        return sum(line.amount_cents for line in self.lines)

    def render(self) -> str:
        width = max([len(line.description) for line in self.lines] + [30])
        out = [f"Invoice preview for {self.org_id}, period {self.period} (plan: {self.plan})"]
        for line in self.lines:
            quantity = f"{line.quantity:>14,}" if line.quantity is not None else " " * 14
            out.append(
                f"  {line.description:<{width}} {quantity} {format_cents(line.amount_cents):>14}"
            )
        out.append(f"  {'Total due':<{width}} {'':>14} {format_cents(self.total_cents):>14}")
        return "\n".join(out)


def invoice_preview(engine: Engine, book: PriceBook, org_id: str, period: str) -> InvoicePreview:
    with engine.connect() as connection:
        return read_invoice(connection, book, org_id, period)


def read_invoice(
    connection: Connection, book: PriceBook, org_id: str, period: str
) -> InvoicePreview:
    """The invoice as ``connection`` sees the ledger (Stripe sync plans inside its transaction)."""
    lower, upper = period_bounds(period)
    in_period = (
        UsageRow.org_id == org_id,
        UsageRow.started_at >= lower,
        UsageRow.started_at < upper,
    )
    per_line = connection.execute(
        select(
            UsageRow.tier,
            UsageRow.price_version,
            func.sum(UsageRow.prompt_tokens - UsageRow.cached_tokens).label("uncached"),
            func.sum(UsageRow.cached_tokens).label("cached"),
            func.sum(UsageRow.completion_tokens).label("output"),
            func.sum(UsageRow.list_cost_nano_usd).label("list_cost"),
            func.sum(UsageRow.allowance_consumed_nano_usd).label("allowance"),
        )
        .where(*in_period)
        .group_by(UsageRow.tier, UsageRow.price_version)
        .order_by(UsageRow.tier, UsageRow.price_version)
    ).all()
    plan_name = connection.execute(
        select(UsageRow.plan).where(*in_period).order_by(UsageRow.id.desc()).limit(1)
    ).scalar_one_or_none()
    adjustment = connection.execute(
        select(
            func.coalesce(func.sum(UsageAdjustment.list_cost_delta_nano_usd), 0),
            func.coalesce(func.sum(UsageAdjustment.allowance_delta_nano_usd), 0),
        ).where(
            UsageAdjustment.org_id == org_id,
            UsageAdjustment.effective_at >= lower,
            UsageAdjustment.effective_at < upper,
        )
    ).one()
    preview = InvoicePreview(org_id=org_id, period=period, plan=plan_name)
    list_total = allowance_total = 0
    versions = {v.version: v for v in book.versions}
    for row in per_line:
        prices = (
            versions[row.price_version].tiers[row.tier] if row.price_version in versions else None
        )
        if prices is None:
            raise PriceBookError(f"price version {row.price_version} is not in the price book")
        for direction, label, tokens, price in (
            ("input", "input tokens", int(row.uncached or 0), prices.input),
            ("cached_input", "cached input tokens", int(row.cached or 0), prices.cached_input),
            ("output", "output tokens", int(row.output or 0), prices.output),
        ):
            if tokens:
                per_million = _per_million(price)
                preview.lines.append(
                    InvoiceLine(
                        key=f"{row.tier}.{direction}.{row.price_version}",
                        description=(
                            f"composer-2.5 {row.tier} {label} @ {per_million} "
                            f"(v{row.price_version})"
                        ),
                        quantity=tokens,
                        amount_nano_usd=tokens * price,
                    )
                )
        list_total += int(row.list_cost or 0)
        allowance_total += int(row.allowance or 0)
    list_delta, allowance_delta = int(adjustment[0]), int(adjustment[1])
    if list_delta:
        preview.lines.append(InvoiceLine(ADJUSTMENTS_LINE, "Adjustments", None, list_delta))
    list_total += list_delta
    allowance_total += allowance_delta
    if list_total != allowance_total:
        preview.lines.append(
            InvoiceLine(
                PROMOTION_LINE,
                "Launch promotion (usage counts less)",
                None,
                allowance_total - list_total,
            )
        )
    if plan_name is not None:
        try:
            included = book.plan(plan_name).included_nano
        except PriceBookError:
            included = 0
        preview.lines.append(
            InvoiceLine(
                ALLOWANCE_LINE,
                f"Included allowance ({plan_name})",
                None,
                -min(included, allowance_total),
            )
        )
    return preview


def _per_million(price_nano_per_token: int) -> str:
    """Nano-USD per token as dollars per 1M tokens: 1M x nano-USD = price / 10 cents."""
    cents, tenths = divmod(price_nano_per_token, 10)
    suffix = str(tenths) if tenths else ""
    return f"{format_cents(cents)}{suffix}/1M"
