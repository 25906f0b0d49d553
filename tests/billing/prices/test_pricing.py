"""Exact integer prices per tier, the launch window's edges, and price-book validation that
names the broken entry. (Which tier a request is billed in is serving.vocabulary's rule, tested
in tests/serving/test_tier_resolution.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from billing.prices.money import format_cents, format_nano_usd, round_to_cents, usd_to_nano
from billing.prices.pricing import (
    PriceBookError,
    charge,
    load_pricebook,
    parse_pricebook,
)
from billing.settings import DEFAULT_PRICEBOOK_PATH
from tests.support.billing import shipped_book

BOOK = load_pricebook(DEFAULT_PRICEBOOK_PATH)
LAUNCH = BOOK.promotions[0].starts_at
BEFORE_LAUNCH = LAUNCH - timedelta(days=1)


@pytest.mark.parametrize(
    ("tier", "input_nano", "output_nano"),
    [("standard", 500, 2_500), ("fast", 3_000, 15_000)],
)
def test_per_token_prices_are_exact_integers(tier: str, input_nano: int, output_nano: int) -> None:
    prices = BOOK.version_at(BEFORE_LAUNCH).tiers[tier]  # type: ignore[index]
    assert (prices.input, prices.cached_input, prices.output) == (
        input_nano,
        input_nano,
        output_nano,
    )
    priced = charge(
        BOOK,
        tier=tier,  # type: ignore[arg-type]
        model="composer-2.5",
        prompt_tokens=1_000_000,
        cached_tokens=0,
        completion_tokens=1_000_000,
        at=BEFORE_LAUNCH,
    )
    # $0.50 + $2.50 per million in and out (standard), $3 + $15 (fast), to the nano-dollar.
    assert priced.list_cost_nano == 1_000_000 * (input_nano + output_nano)
    assert isinstance(priced.list_cost_nano, int)
    assert priced.allowance_cost_nano == priced.list_cost_nano
    assert priced.price_version == "2026-11-01"


def test_one_request_priced_by_hand() -> None:
    priced = charge(
        BOOK,
        tier="fast",
        model="composer-2.5-fast",
        prompt_tokens=1234,
        cached_tokens=200,
        completion_tokens=567,
        at=BEFORE_LAUNCH,
    )
    assert priced.input_nano == 1034 * 3000
    assert priced.cached_input_nano == 200 * 3000
    assert priced.output_nano == 567 * 15000
    assert priced.list_cost_nano == 12_207_000
    assert format_nano_usd(priced.list_cost_nano) == "$0.012207000"


@pytest.mark.parametrize(
    ("at", "multiplier"),
    [
        (LAUNCH - timedelta(microseconds=1), Fraction(1)),  # the instant before
        (LAUNCH, Fraction(2)),  # its first instant
        (LAUNCH + timedelta(days=7) - timedelta(microseconds=1), Fraction(2)),  # its last
        (LAUNCH + timedelta(days=7), Fraction(1)),  # 7 days after
    ],
    ids=["instant-before", "first-instant", "last-instant", "seven-days-after"],
)
def test_launch_window_edges(at: datetime, multiplier: Fraction) -> None:
    assert BOOK.usage_multiplier_at("composer-2.5", at) == multiplier
    priced = charge(
        BOOK,
        tier="fast",
        model="composer-2.5",
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=10,
        at=at,
    )
    assert priced.list_cost_nano == 180_000
    assert priced.allowance_cost_nano * multiplier == priced.list_cost_nano
    assert (priced.promotion_id is not None) == (multiplier != 1)


def test_promotion_applies_to_the_model_family_only() -> None:
    assert BOOK.usage_multiplier_at("composer-2.5-standard", LAUNCH) == 2
    assert BOOK.usage_multiplier_at("other-model", LAUNCH) == 1


def test_a_price_change_is_a_new_version(tmp_path: Path) -> None:
    data = shipped_book()
    newer = yaml.safe_load(yaml.safe_dump(data["versions"][0]))
    newer["version"] = "2027-01-01"
    newer["effective_from"] = "2027-01-01T00:00:00Z"
    newer["tiers"]["fast"]["output_per_1m"] = "12.00"
    data["versions"].append(newer)
    book = parse_pricebook(data)
    kwargs = {"tier": "fast", "model": "x", "prompt_tokens": 0, "cached_tokens": 0}
    old = charge(book, completion_tokens=1, at=datetime(2026, 12, 31, 23, 59, tzinfo=UTC), **kwargs)  # type: ignore[arg-type]
    new = charge(book, completion_tokens=1, at=datetime(2027, 1, 1, tzinfo=UTC), **kwargs)  # type: ignore[arg-type]
    assert (old.price_version, old.list_cost_nano) == ("2026-11-01", 15_000)
    assert (new.price_version, new.list_cost_nano) == ("2027-01-01", 12_000)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b["versions"][0]["tiers"]["fast"].update(input_per_1m=3.0), "quoted decimal"),
        (
            lambda b: b["versions"][0]["tiers"]["fast"].update(input_per_1m="0.0000001"),
            "whole nano",
        ),
        (lambda b: b["versions"][0]["tiers"].pop("standard"), "tiers must price"),
        (lambda b: b["plans"]["pro"].update(overage="maybe"), "plans.pro.overage"),
        (lambda b: b["plans"]["free"].update(rpm=0), "plans.free.rpm"),
        (lambda b: b["promotions"][0].update(starts_at="2026-12-01T17:00:00"), "timezone"),
        (lambda b: b["promotions"][0].update(usage_multiplier="7"), "not divisible"),
    ],
)
def test_invalid_price_books_are_rejected_with_the_entry_named(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = shipped_book()
    mutate(data)
    with pytest.raises(PriceBookError, match=message):
        parse_pricebook(data)


def test_missing_price_book_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PriceBookError, match="cannot read the price book"):
        load_pricebook(tmp_path / "nope.yaml")


def test_money_helpers_never_use_floats() -> None:
    assert usd_to_nano("0.50") == 500_000_000
    assert usd_to_nano("$15.00") == 15_000_000_000
    with pytest.raises(ValueError, match="quoted decimal"):
        usd_to_nano(0.5)  # type: ignore[arg-type]
    assert round_to_cents(4_999_999) == 0
    assert round_to_cents(5_000_000) == 1
    assert round_to_cents(-5_000_000) == -1
    assert format_cents(123_456) == "$1,234.56"
    assert format_nano_usd(-1) == "-$0.000000001"
