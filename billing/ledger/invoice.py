"""Invoice preview: the period's lines for an org, each rounded to cents exactly once.

Usage lines show list price per tier, direction and price version; the included allowance
and the launch promotion appear as credits (billing.allowance: the allowance covers the
month's first requests in start order, a promotion counting them 1/m against it), and what
is left is the overage at list price, plus any adjustments. Every line is computed in
nano-USD and rounded once; the total is the sum of the rounded lines, as on a real
invoice. Each line has a stable key (``fast.output.2026-11-01``, ``promotion``,
``allowance``, ``adjustments``): Stripe's invoice items mirror the lines by that key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, func, select

from billing.allowance import in_month, month_allowance
from billing.ledger import UsageAdjustment, UsageRow
from billing.prices.money import format_cents, round_to_cents
from billing.prices.periods import period_bounds
from billing.prices.pricebook import PriceBook, PriceBookError

#: Keys of the lines that are not usage (usage lines are ``tier.direction.price_version``).
PROMOTION_LINE = "promotion"
ALLOWANCE_LINE = "allowance"
ADJUSTMENTS_LINE = "adjustments"


@dataclass(frozen=True)
class InvoiceLine:
    #: Stable across recomputations of the same period, whatever the amounts.
    key: str
    description: str
    #: Tokens (usage lines); None for credits and adjustments.
    quantity: int | None
    amount_nano_usd: int
    #: Nano-USD per token (usage lines: amount = quantity x unit price, exactly).
    unit_price_nano_usd: int | None = None

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
    per_line = connection.execute(
        select(
            UsageRow.tier,
            UsageRow.price_version,
            func.sum(UsageRow.prompt_tokens - UsageRow.cached_tokens).label("uncached"),
            func.sum(UsageRow.cached_tokens).label("cached"),
            func.sum(UsageRow.completion_tokens).label("output"),
        )
        .where(*in_month(org_id, period))
        .group_by(UsageRow.tier, UsageRow.price_version)
        .order_by(UsageRow.tier, UsageRow.price_version)
    ).all()
    month = month_allowance(connection, book, org_id, period)
    adjustment = connection.execute(
        select(func.coalesce(func.sum(UsageAdjustment.list_cost_delta_nano_usd), 0)).where(
            UsageAdjustment.org_id == org_id,
            UsageAdjustment.effective_at >= lower,
            UsageAdjustment.effective_at < upper,
        )
    ).scalar_one()
    preview = InvoicePreview(org_id=org_id, period=period, plan=month.plan)
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
                preview.lines.append(
                    InvoiceLine(
                        key=f"{row.tier}.{direction}.{row.price_version}",
                        description=(
                            f"composer-2.5 {row.tier} {label} @ {_per_million(price)} "
                            f"(v{row.price_version})"
                        ),
                        quantity=tokens,
                        amount_nano_usd=tokens * price,
                        unit_price_nano_usd=price,
                    )
                )
    taken = month.total
    if taken.promotion_credit_nano:
        preview.lines.append(
            InvoiceLine(
                PROMOTION_LINE,
                "Launch promotion (usage counted less against the allowance)",
                None,
                -taken.promotion_credit_nano,
            )
        )
    if month.plan is not None:
        preview.lines.append(
            InvoiceLine(
                ALLOWANCE_LINE,
                f"Included allowance ({month.plan})",
                None,
                -taken.allowance_nano,
            )
        )
    if adjustment:
        preview.lines.append(InvoiceLine(ADJUSTMENTS_LINE, "Adjustments", None, int(adjustment)))
    return preview


def _per_million(price_nano_per_token: int) -> str:
    """Nano-USD per token as dollars per 1M tokens: 1M x nano-USD = price / 10 cents."""
    cents, tenths = divmod(price_nano_per_token, 10)
    suffix = str(tenths) if tenths else ""
    return f"{format_cents(cents)}{suffix}/1M"
