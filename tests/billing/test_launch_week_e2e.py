"""The launch week end to end, checked by hand: a real gateway process (billing's real Meter,
usage reader and accounts) in front of the session's vLLM, the openai SDK sending mixed
traffic (both tiers, streamed and not, ``n`` up to 3, prompt lists) that crosses the
org's allowance during the promotion, the ledger worker's job, Stripe (the stand-in) and
`cstack billing reconcile --all`.

The expected invoice is computed here from the published rule and prices alone, from the
tokens each client was told it used: a promotion multiplies the allowance (usage counts
half against it) and nothing else; the requests take the allowance in the order they
started, the one that crosses it is split, the rest is overage at list price. The
requests before the crossing are sent one after another (so their order is known); those
after it are sent together (all overage, so their order does not matter).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from billing_support import (
    TEST_VERSIONS,
    StripeStandIn,
    create_org_key,
    set_customers,
    write_test_book,
)
from gateway_processes import gateway_processes
from openai import AsyncOpenAI
from pydantic import SecretStr
from typer.testing import CliRunner

from billing.cli import billing_app
from billing.consumer import UsageStreamConsumer
from billing.invoice import invoice_preview
from billing.ledger import make_engine, migrate
from billing.money import round_to_cents
from billing.periods import period_of
from billing.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe_api import list_invoice_items, stripe_client
from billing.stripe_sync import sync_stripe

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

#: The published prices (nano-USD per token) and the plan: $0.001 included.
PRICES = {"fast": (3000, 15000), "standard": (500, 2500)}
INCLUDED = 1_000_000
#: Request shapes, cycled: (endpoint, tier, stream, n).
SHAPES = [
    ("chat", "fast", False, 1),
    ("chat", "standard", True, 2),
    ("completions", "fast", False, 3),
    ("completions", "standard", True, 3),
    ("chat", "fast", True, 3),
    ("completions", "standard", False, 2),
]


@pytest.fixture
def stack(
    billing_settings: BillingSettings,
    ledger_url: str,
    vllm_url: str,
    stripe_server: Any,
    tmp_path: Path,
) -> Iterator[tuple[str, BillingSettings, StripeStandIn]]:
    now = datetime.now(UTC)
    book = write_test_book(
        tmp_path / "launch.yaml",
        versions=TEST_VERSIONS,
        plans={"launch": {"included_usd": "0.001", "overage": "billed",
                          "overage_budget_usd": "1.00", "rpm": 100000, "tpm": 100000000}},
        promotions=[{"id": "launch-week", "starts_at": (now - timedelta(days=1)).isoformat(),
                     "days": 7, "models": ["composer-2.5*"], "usage_multiplier": "2"}],
    )  # fmt: skip
    server = stripe_server()
    settings = billing_settings.model_copy(
        update={
            "ledger_url": ledger_url,
            "pricebook_path": book,
            "stripe_api_base": server.base_url,
            "stripe_api_key": SecretStr("sk_test_launch"),
            "stripe_post_open_periods": True,
        }
    )
    engine = make_engine(ledger_url)
    migrate(engine)
    engine.dispose()
    with gateway_processes(settings.model_dump(), vllm_url, tmp_path, count=1) as urls:
        yield urls[0], settings, server


async def send(client: AsyncOpenAI, number: int) -> dict[str, Any]:
    """One request of the ``number``th shape; what its client was told: tokens and tier."""
    endpoint, tier, stream, n = SHAPES[number % len(SHAPES)]
    model = f"composer-2.5-{tier}"
    common: dict[str, Any] = {"model": model, "n": n, "max_tokens": 12, "seed": number,
                              "temperature": 1.0}  # fmt: skip
    if stream:
        common |= {"stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        messages = [{"role": "user", "content": f"Tell me about {number}."}]
        answer = await client.chat.completions.create(messages=messages, **common)
    else:
        prompt = [f"Once upon {number}", "The end"] if number % 2 else f"Number {number}:"
        answer = await client.completions.create(prompt=prompt, **common)
    if stream:
        chunks = [chunk async for chunk in answer]  # type: ignore[union-attr]
        usage, response_id = chunks[-1].usage, chunks[-1].id
    else:
        usage, response_id = answer.usage, answer.id  # type: ignore[union-attr]
    assert usage is not None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details else 0
    return {
        "id": response_id,
        "tier": tier,
        "prompt": usage.prompt_tokens,
        "cached": cached,
        "completion": usage.completion_tokens,
        "cost": usage.model_extra["cstack_cost"],  # type: ignore[index]
    }


def list_cost(request: dict[str, Any]) -> int:
    """What the published prices say a request costs (cached input at the input price)."""
    price_in, price_out = PRICES[request["tier"]]
    return request["prompt"] * price_in + request["completion"] * price_out


async def test_the_launch_week_invoice_is_the_published_rule(
    stack: tuple[str, BillingSettings, StripeStandIn],
) -> None:
    gateway, settings, _ = stack
    org = f"org-launch-{uuid.uuid4().hex[:6]}"
    token, _ = await create_org_key(settings.redis_url, org, "launch")
    client = AsyncOpenAI(base_url=f"{gateway}/v1", api_key=token, max_retries=0, timeout=300)

    # One after another until the allowance is crossed (and two more), at half cost.
    in_order: list[dict[str, Any]] = []
    allowance_cost = 0
    while allowance_cost <= INCLUDED or len(in_order) < 3:
        request = await send(client, len(in_order))
        in_order.append(request)
        allowance_cost += list_cost(request) // 2
    in_order += [await send(client, len(in_order)) for _ in range(2)]
    # Then six at once: all of them past the allowance.
    together = await asyncio.gather(*(send(client, len(in_order) + i) for i in range(6)))
    requests = in_order + list(together)
    assert len(requests) > len(SHAPES)  # every shape at least once
    assert all(r["cost"]["list_cost_nano_usd"] == list_cost(r) for r in requests)
    assert all(r["cost"]["promotion"] == {"id": "launch-week", "usage_multiplier": "2"}
               for r in requests)  # fmt: skip

    # The rule, by hand.
    left, allowance, covered, overage = INCLUDED, 0, 0, 0
    crossing = None
    for request in requests:
        cost, half = list_cost(request), list_cost(request) // 2
        if half <= left:
            allowance, covered, left = allowance + half, covered + cost, left - half
        elif left > 0:
            crossing = request["id"]
            allowance, covered = allowance + left, covered + 2 * left
            overage += cost - 2 * left
            left = 0
        else:
            overage += cost
    assert allowance == INCLUDED  # crossed (by one request, unless one ended on it exactly)
    expected: dict[str, int] = {}
    for tier in PRICES:
        mine = [r for r in requests if r["tier"] == tier]
        tokens_in = sum(r["prompt"] - r["cached"] for r in mine)
        tokens_out = sum(r["completion"] for r in mine)
        version = TEST_VERSIONS[0]["version"]
        expected[f"{tier}.input.{version}"] = tokens_in * PRICES[tier][0]
        expected[f"{tier}.output.{version}"] = tokens_out * PRICES[tier][1]
    expected["promotion"] = -(covered - allowance)
    expected["allowance"] = -allowance
    assert sum(expected.values()) == overage > 0

    # The ledger worker's job; then the invoice is the hand computation.
    sync = redis.Redis.from_url(settings.redis_url)
    engine = make_engine(settings.ledger_url)
    UsageStreamConsumer(sync, engine, settings).drain(max_seconds=60)
    sync.close()
    book = load_pricebook(settings.pricebook_path)
    period = period_of(datetime.now(UTC))
    preview = invoice_preview(engine, book, org, period)
    assert {line.key: line.amount_nano_usd for line in preview.lines if line.amount_nano_usd} == {
        key: amount for key, amount in expected.items() if amount
    }
    total_cents = sum(round_to_cents(amount) for amount in expected.values())
    assert preview.total_cents == total_cents

    # The receipts add up to it exactly, and each says what its answer said.
    api = httpx.Client(base_url=f"{gateway}/v1/usage", headers={"authorization": f"Bearer {token}"})
    receipts: list[dict[str, Any]] = []
    after = None
    while True:
        page = api.get("/requests", params={"limit": 7, **({"after": after} if after else {})})
        assert page.status_code == 200, page.text
        receipts += page.json()["data"]
        if not page.json()["has_more"]:
            break
        after = page.json()["last_id"]
    assert len(receipts) == len(requests)
    assert sum(r["list_cost_nano_usd"] for r in receipts) == sum(map(list_cost, requests))
    assert sum(r["allowance_consumed_nano_usd"] for r in receipts) == allowance
    assert sum(r["promotion_credit_nano_usd"] for r in receipts) == covered - allowance
    assert sum(r["overage_nano_usd"] for r in receipts) == overage
    split = [
        r["id"] for r in receipts if r["allowance_consumed_nano_usd"] and r["overage_nano_usd"]
    ]
    assert split == ([api.get(f"/requests/{crossing}").json()["id"]] if crossing else [])
    for request in requests[:3]:
        shown = api.get(f"/requests/{request['id']}").json()
        assert (shown["input_tokens"], shown["output_tokens"]) == (
            request["prompt"],
            request["completion"],
        )
    totals = api.get(f"{gateway}/v1/usage").json()["totals"]
    assert (totals["allowance_used_nano_usd"], totals["overage_nano_usd"]) == (allowance, overage)
    api.close()

    # Stripe gets the same invoice, to the cent, at the org's customer.
    customer = f"cus_{uuid.uuid4().hex[:10]}"
    set_customers(engine, {org: customer})
    sync_stripe(engine, book, settings, datetime.now(UTC))
    items = list_invoice_items(stripe_client(settings), customer)
    assert sum(item.amount_cents for item in items) == total_cents
    assert len(items) == len([line for line in preview.lines if line.amount_cents])
    assert settings.stripe_api_key is not None
    agreed = CliRunner().invoke(
        billing_app,
        ["reconcile", "--all", "--period", period],
        env={
            "CSTACK_LEDGER_URL": settings.ledger_url,
            "CSTACK_PRICEBOOK_PATH": str(settings.pricebook_path),
            "CSTACK_STRIPE_API_BASE": settings.stripe_api_base,
            "CSTACK_STRIPE_API_KEY": settings.stripe_api_key.get_secret_value(),
        },
    )
    assert agreed.exit_code == 0, agreed.output
    engine.dispose()
