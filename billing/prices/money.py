"""Integer nano-USD: parsing dollar strings, formatting, rounding to cents.

Money is an ``int`` of nano-USD (1e-9 $) everywhere; ``Decimal`` appears only at the
edges (parsing a price book, printing), and a float is rejected outright so that a
YAML number like ``0.1`` can never smuggle binary rounding into a price.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

NANO_PER_USD = 1_000_000_000
NANO_PER_CENT = 10_000_000


def usd_to_nano(amount: str | int | Decimal, *, what: str = "amount") -> int:
    """Parse a dollar amount (``"0.50"``) into exact integer nano-USD."""
    if isinstance(amount, (bool, float)):
        raise ValueError(f"{what}: write money as a quoted decimal string, got {amount!r}")
    try:
        value = Decimal(str(amount).strip().lstrip("$"))
    except InvalidOperation as exc:
        raise ValueError(f"{what}: {amount!r} is not a dollar amount") from exc
    nano = value * NANO_PER_USD
    if nano != nano.to_integral_value():
        raise ValueError(f"{what}: {amount!r} is finer than one nano-USD")
    return int(nano)


def format_nano_usd(nano: int) -> str:
    """Exact dollars with all nine decimals, e.g. ``"$0.000003000"``."""
    sign = "-" if nano < 0 else ""
    whole, frac = divmod(abs(nano), NANO_PER_USD)
    return f"{sign}${whole}.{frac:09d}"


def round_to_cents(nano: int) -> int:
    """Round half away from zero to whole cents, returned as integer cents."""
    cents = (Decimal(nano) / NANO_PER_CENT).quantize(Decimal(1), rounding=ROUND_HALF_UP)
    return int(cents)


def format_cents(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}${whole:,}.{frac:02d}"
