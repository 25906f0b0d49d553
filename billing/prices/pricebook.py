"""The versioned price book: prices per tier, plans and promotions, loaded and validated.

The book is data, not code, so that a price change or a new promotion is a reviewed
config change. Validation is strict and names the offending entry: a typo in a price book
is a billing incident.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from billing.prices.money import usd_to_nano
from serving.vocabulary import TIERS, Tier

TOKENS_PER_MILLION = 1_000_000


class PriceBookError(ValueError):
    """The price book file is missing or invalid; the message names the entry."""


@dataclass(frozen=True)
class TierPrices:
    """Integer nano-USD per token."""

    input: int
    cached_input: int
    output: int


@dataclass(frozen=True)
class PriceVersion:
    version: str
    effective_from: datetime
    tiers: dict[Tier, TierPrices]


@dataclass(frozen=True)
class Plan:
    name: str
    included_nano: int
    overage_billed: bool
    overage_budget_nano: int
    rpm: int
    tpm: int

    @property
    def period_cap_nano(self) -> int:
        """Budget units an org may consume per period: its allowance (consumed at allowance
        cost, list / a promotion's multiplier) plus its overage budget (list dollars):
        billing.allowance.budget_units."""
        return self.included_nano + (self.overage_budget_nano if self.overage_billed else 0)


@dataclass(frozen=True)
class Promotion:
    id: str
    starts_at: datetime
    #: Exclusive end: the window is ``[starts_at, ends_at)``.
    ends_at: datetime
    models: tuple[str, ...]
    #: The allowance is multiplied this much: usage counts 1/multiplier against it
    #: (allowance cost x multiplier = list cost). Overage stays at list price.
    usage_multiplier: Fraction

    def applies(self, model: str, at: datetime) -> bool:
        return self.starts_at <= at < self.ends_at and _matches(model, self.models)


@lru_cache(maxsize=1024)
def _matches(model: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``model`` matches one of the patterns (remembered: every admission and
    settlement asks, for the few models served)."""
    return any(fnmatch.fnmatchcase(model, pattern) for pattern in patterns)


@dataclass(frozen=True)
class PriceBook:
    versions: tuple[PriceVersion, ...]
    plans: dict[str, Plan]
    promotions: tuple[Promotion, ...]

    def version_at(self, at: datetime) -> PriceVersion:
        """The price version in effect at ``at`` (the latest one that started)."""
        for version in reversed(self.versions):  # in increasing effective_from order
            if version.effective_from <= at:
                return version
        raise PriceBookError(f"no price version is in effect at {at.isoformat()}")

    def promotion_at(self, model: str, at: datetime) -> Promotion | None:
        for promotion in self.promotions:
            if promotion.applies(model, at):
                return promotion
        return None

    def usage_multiplier_at(self, model: str, at: datetime) -> Fraction:
        promotion = self.promotion_at(model, at)
        return promotion.usage_multiplier if promotion else Fraction(1)

    def next_change_after(self, at: datetime) -> datetime | None:
        """The first instant after ``at`` at which a price or a promotion changes (None: no
        change is scheduled): a price computed at ``at`` holds until then."""
        instants = [v.effective_from for v in self.versions]
        for promotion in self.promotions:
            instants += [promotion.starts_at, promotion.ends_at]
        return min((instant for instant in instants if instant > at), default=None)

    def plan(self, name: str) -> Plan:
        try:
            return self.plans[name]
        except KeyError:
            raise PriceBookError(f"plan {name!r} is not in the price book") from None

    def included_nano(self, plan: str | None) -> int:
        """The allowance of ``plan`` (none for no plan, or one gone from the book: its
        usage is overage)."""
        found = self.plans.get(plan) if plan is not None else None
        return found.included_nano if found is not None else 0


def _instant(raw: Any, where: str) -> datetime:
    if isinstance(raw, datetime):
        value = raw
    else:
        try:
            value = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
        except ValueError as exc:
            raise PriceBookError(f"{where}: {raw!r} is not an ISO-8601 instant") from exc
    if value.tzinfo is None:
        raise PriceBookError(f"{where}: {raw!r} needs a timezone (write ...Z for UTC)")
    return value.astimezone(UTC)


def _per_token(raw: Any, where: str) -> int:
    """A price per 1M tokens in dollars -> integer nano-USD per token."""
    try:
        per_million = usd_to_nano(raw, what=where)
    except ValueError as exc:
        raise PriceBookError(str(exc)) from exc
    per_token, remainder = divmod(per_million, TOKENS_PER_MILLION)
    if remainder or per_token < 0:
        raise PriceBookError(f"{where}: {raw!r} per 1M is not a whole nano-USD per token")
    return per_token


def _money(raw: Any, where: str) -> int:
    try:
        nano = usd_to_nano(raw, what=where)
    except ValueError as exc:
        raise PriceBookError(str(exc)) from exc
    if nano < 0:
        raise PriceBookError(f"{where}: must not be negative")
    return nano


def _positive_int(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise PriceBookError(f"{where}: expected a positive integer, got {raw!r}")
    return raw


def _parse_version(raw: dict[str, Any], index: int) -> PriceVersion:
    where = f"versions[{index}]"
    version = str(raw.get("version") or "")
    if not version:
        raise PriceBookError(f"{where}.version is missing")
    tiers_raw = raw.get("tiers") or {}
    if set(tiers_raw) != set(TIERS):
        raise PriceBookError(f"{where}.tiers must price exactly {list(TIERS)}")
    tiers: dict[Tier, TierPrices] = {}
    for tier in TIERS:
        entry = tiers_raw[tier]
        at = f"{where}.tiers.{tier}"
        input_price = _per_token(entry.get("input_per_1m"), f"{at}.input_per_1m")
        cached_raw = entry.get("cached_input_per_1m", entry.get("input_per_1m"))
        tiers[tier] = TierPrices(
            input=input_price,
            cached_input=_per_token(cached_raw, f"{at}.cached_input_per_1m"),
            output=_per_token(entry.get("output_per_1m"), f"{at}.output_per_1m"),
        )
    effective = _instant(raw.get("effective_from"), f"{where}.effective_from")
    return PriceVersion(version=version, effective_from=effective, tiers=tiers)


def _parse_plan(name: str, raw: dict[str, Any]) -> Plan:
    where = f"plans.{name}"
    overage = raw.get("overage")
    if overage not in ("billed", "refused"):
        raise PriceBookError(f"{where}.overage must be 'billed' or 'refused', got {overage!r}")
    budget = raw.get("overage_budget_usd", "0")
    return Plan(
        name=name,
        included_nano=_money(raw.get("included_usd"), f"{where}.included_usd"),
        overage_billed=overage == "billed",
        overage_budget_nano=_money(budget, f"{where}.overage_budget_usd"),
        rpm=_positive_int(raw.get("rpm"), f"{where}.rpm"),
        tpm=_positive_int(raw.get("tpm"), f"{where}.tpm"),
    )


def _parse_promotion(raw: dict[str, Any], index: int) -> Promotion:
    where = f"promotions[{index}]"
    starts = _instant(raw.get("starts_at"), f"{where}.starts_at")
    days = _positive_int(raw.get("days"), f"{where}.days")
    try:
        multiplier = Fraction(str(raw.get("usage_multiplier")))
    except (ValueError, ZeroDivisionError) as exc:
        raise PriceBookError(f"{where}.usage_multiplier must be a number like '2'") from exc
    if multiplier < 1:
        raise PriceBookError(f"{where}.usage_multiplier must be at least 1")
    models = tuple(str(m) for m in raw.get("models") or ())
    if not models:
        raise PriceBookError(f"{where}.models is empty")
    return Promotion(
        id=str(raw.get("id") or f"promotion-{index}"),
        starts_at=starts,
        ends_at=starts + timedelta(days=days),
        models=models,
        usage_multiplier=multiplier,
    )


def _check_exact_allowance(book: PriceBook) -> None:
    """Allowance = list / multiplier must be an exact integer for every token price."""
    for promotion in book.promotions:
        m = promotion.usage_multiplier
        for version in book.versions:
            for tier, prices in version.tiers.items():
                for price in (prices.input, prices.cached_input, prices.output):
                    if (price * m.denominator) % m.numerator:
                        raise PriceBookError(
                            f"promotion {promotion.id}: {tier} price {price} nano-USD/token "
                            f"(version {version.version}) is not divisible by {m}"
                        )


def parse_pricebook(data: dict[str, Any]) -> PriceBook:
    if not isinstance(data, dict):
        raise PriceBookError("the price book must be a mapping")
    versions = tuple(_parse_version(v, i) for i, v in enumerate(data.get("versions") or []))
    if not versions:
        raise PriceBookError("versions: at least one price version is required")
    if any(a.effective_from >= b.effective_from for a, b in itertools.pairwise(versions)):
        raise PriceBookError("versions must be in increasing effective_from order")
    if len({v.version for v in versions}) != len(versions):
        raise PriceBookError("versions: version names must be unique")
    book = PriceBook(
        versions=versions,
        plans={str(n): _parse_plan(str(n), p) for n, p in (data.get("plans") or {}).items()},
        promotions=tuple(
            _parse_promotion(p, i) for i, p in enumerate(data.get("promotions") or [])
        ),
    )
    if not book.plans:
        raise PriceBookError("plans: at least one plan is required")
    _check_exact_allowance(book)
    return book


def load_pricebook(path: Path) -> PriceBook:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PriceBookError(f"cannot read the price book {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PriceBookError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return parse_pricebook(data)
    except PriceBookError as exc:
        raise PriceBookError(f"{path}: {exc}") from None
