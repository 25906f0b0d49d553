"""Pricing: what a request costs, in exact integer nano-USD, and what it uses of a plan.

The gateway and the ledger both price through here, so an admission reservation, a usage
event and an invoice line can never disagree about a price.
"""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from billing.prices.money import format_nano_usd, usd_to_nano
from billing.prices.pricebook import (
    Plan,
    PriceBook,
    PriceBookError,
    PriceVersion,
    Promotion,
    TierPrices,
    load_pricebook,
    parse_pricebook,
)
from serving.vocabulary import Tier

__all__ = [
    "Charge",
    "Plan",
    "PriceBook",
    "PriceBookError",
    "PriceVersion",
    "Promotion",
    "TierPrices",
    "charge",
    "format_nano_usd",
    "load_pricebook",
    "parse_pricebook",
    "pricebook_from_path",
    "usd_to_nano",
    "worst_case_charge",
]


class Charge(NamedTuple):
    """A priced request; every amount is integer nano-USD.

    A named tuple, not a frozen dataclass: as immutable, and a third of the cost to make
    (every metered request is priced twice, at admission and at settlement)."""

    price_version: str
    tier: Tier
    input_nano: int
    cached_input_nano: int
    output_nano: int
    #: What the usage would cost at list price (what invoices show before promotions).
    list_cost_nano: int
    #: What it takes of the plan's allowance while enough is left: list cost / usage
    #: multiplier, exactly (billing.allowance splits the month in start order).
    allowance_cost_nano: int
    usage_multiplier: Fraction
    promotion_id: str | None


#: The usage multiplier outside any promotion (made once: a Fraction costs to construct).
NO_PROMOTION = Fraction(1)


def _validate_tokens(prompt: int, cached: int, completion: int) -> None:
    if min(prompt, cached, completion) < 0:
        raise ValueError("token counts must not be negative")
    if cached > prompt:
        raise ValueError(f"cached tokens ({cached}) exceed prompt tokens ({prompt})")


def charge(
    book: PriceBook,
    *,
    tier: Tier,
    model: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    at: datetime,
) -> Charge:
    """Price a request that started at ``at``. Cached tokens are part of the prompt.

    A naive ``at`` is taken as UTC (the gateway's clocks are UTC).
    """
    _validate_tokens(prompt_tokens, cached_tokens, completion_tokens)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    version = book.version_at(at)
    prices = version.tiers[tier]
    input_nano = (prompt_tokens - cached_tokens) * prices.input
    cached_nano = cached_tokens * prices.cached_input
    output_nano = completion_tokens * prices.output
    list_cost = input_nano + cached_nano + output_nano
    promotion = book.promotion_at(model, at)
    multiplier = promotion.usage_multiplier if promotion else NO_PROMOTION
    # The price book guarantees every per-token price divides exactly (see pricebook).
    allowance = list_cost * multiplier.denominator // multiplier.numerator
    return Charge(
        price_version=version.version,
        tier=tier,
        input_nano=input_nano,
        cached_input_nano=cached_nano,
        output_nano=output_nano,
        list_cost_nano=list_cost,
        allowance_cost_nano=allowance,
        usage_multiplier=multiplier,
        promotion_id=promotion.id if promotion else None,
    )


def worst_case_charge(
    book: PriceBook,
    *,
    tier: Tier,
    model: str,
    prompt_tokens: int,
    max_output_tokens: int,
    at: datetime,
) -> Charge:
    """The most a request can cost: its whole prompt uncached plus every output token."""
    return charge(
        book,
        tier=tier,
        model=model,
        prompt_tokens=prompt_tokens,
        cached_tokens=0,
        completion_tokens=max_output_tokens,
        at=at,
    )


def worst_list_cost(
    book: PriceBook, *, tier: Tier, prompt_tokens: int, max_output_tokens: int, at: datetime
) -> int:
    """``worst_case_charge(...).list_cost_nano`` alone, at a tenth of its cost: a busy
    key's lease prices every request it admits (``billing.meter.leases``)."""
    prices = book.version_at(at).tiers[tier]
    return prompt_tokens * prices.input + max_output_tokens * prices.output


@lru_cache(maxsize=8)
def _cached_book(path: Path, mtime_ns: int) -> PriceBook:
    return load_pricebook(path)


def pricebook_from_path(path: Path) -> PriceBook:
    """Load (and cache until the file changes) the price book at ``path``."""
    resolved = Path(path).resolve()
    try:
        mtime = resolved.stat().st_mtime_ns
    except OSError as exc:
        raise PriceBookError(f"cannot read the price book {path}: {exc.strerror}") from exc
    return _cached_book(resolved, mtime)
