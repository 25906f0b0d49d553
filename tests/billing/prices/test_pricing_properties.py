"""Properties of pricing over arbitrary requests and instants (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from billing.prices.pricing import charge, load_pricebook
from billing.settings import DEFAULT_PRICEBOOK_PATH

BOOK = load_pricebook(DEFAULT_PRICEBOOK_PATH)
LAUNCH = BOOK.promotions[0].starts_at

tiers = st.sampled_from(["standard", "fast"])
models = st.sampled_from(["composer-2.5", "composer-2.5-fast", "composer-2.5-standard", "other"])
instants = st.integers(min_value=-3 * 86400, max_value=11 * 86400).map(
    lambda s: LAUNCH + timedelta(seconds=s)
)
counts = st.integers(min_value=0, max_value=10_000_000)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, int]:
    prompt = draw(counts)
    return {
        "prompt_tokens": prompt,
        "cached_tokens": draw(st.integers(min_value=0, max_value=prompt)),
        "completion_tokens": draw(counts),
    }


@st.composite
def split(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """A request and two parts that add up to it (cached tokens stay within each prompt)."""
    whole = draw(requests())
    cached_a = draw(st.integers(min_value=0, max_value=whole["cached_tokens"]))
    cached_b = whole["cached_tokens"] - cached_a
    uncached = whole["prompt_tokens"] - whole["cached_tokens"]
    uncached_a = draw(st.integers(min_value=0, max_value=uncached))
    completion_a = draw(st.integers(min_value=0, max_value=whole["completion_tokens"]))
    a = {
        "prompt_tokens": cached_a + uncached_a,
        "cached_tokens": cached_a,
        "completion_tokens": completion_a,
    }
    b = {
        "prompt_tokens": cached_b + uncached - uncached_a,
        "cached_tokens": cached_b,
        "completion_tokens": whole["completion_tokens"] - completion_a,
    }
    return whole, a, b


@given(split(), tiers, models, instants)
def test_cost_is_additive_over_splits_of_a_request(parts, tier, model, at: datetime) -> None:  # type: ignore[no-untyped-def]
    whole, a, b = parts
    priced = [charge(BOOK, tier=tier, model=model, at=at, **p) for p in (whole, a, b)]
    assert priced[0].list_cost_nano == priced[1].list_cost_nano + priced[2].list_cost_nano
    assert (
        priced[0].allowance_cost_nano
        == priced[1].allowance_cost_nano + priced[2].allowance_cost_nano
    )


@given(requests(), tiers, models, instants)
def test_cost_is_never_negative_and_always_an_integer(request, tier, model, at) -> None:  # type: ignore[no-untyped-def]
    priced = charge(BOOK, tier=tier, model=model, at=at, **request)
    for amount in (priced.list_cost_nano, priced.allowance_cost_nano):
        assert isinstance(amount, int)
        assert amount >= 0
    assert priced.allowance_cost_nano <= priced.list_cost_nano


@given(requests(), tiers, models, instants)
def test_allowance_cost_times_multiplier_is_list_cost(request, tier, model, at) -> None:  # type: ignore[no-untyped-def]
    priced = charge(BOOK, tier=tier, model=model, at=at.astimezone(UTC), **request)
    assert priced.allowance_cost_nano * priced.usage_multiplier == priced.list_cost_nano
    assert priced.usage_multiplier == BOOK.usage_multiplier_at(model, at)
