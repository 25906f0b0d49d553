"""The launch week end to end, checked by hand: a real gateway process (billing's real Meter,
usage reader and accounts) in front of the session's vLLM, the openai SDK sending mixed
traffic (both tiers, streamed and not, ``n`` up to 3, prompt lists) that crosses the
org's allowance during the promotion, the ledger worker's job, Stripe (the stand-in) and
`cstack billing reconcile --all`.

The expected invoice is computed by hand (``launch_traffic.hand_invoice``) from the
published rule and prices alone, from the tokens each client was told it used.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from openai import AsyncOpenAI
from pydantic import SecretStr
from typer.testing import CliRunner

from billing.cli import billing_app
from billing.ledger import make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.ledger.invoice import invoice_preview
from billing.prices.periods import period_of
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe.api import list_invoice_items, stripe_client
from billing.stripe.sync import sync_stripe
from tests.support.billing import TEST_VERSIONS, create_org_key, set_customers, write_test_book
from tests.support.fakes.stripe import StripeStandIn
from tests.support.gateway_processes import gateway_processes
from tests.support.launch_traffic import hand_invoice, list_cost, mixed_traffic

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

#: The plan's allowance: $0.005.
INCLUDED = 5_000_000


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
        plans={"launch": {"included_usd": "0.005", "overage": "billed",
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


async def test_the_launch_week_invoice_is_the_published_rule(
    stack: tuple[str, BillingSettings, StripeStandIn],
) -> None:
    gateway, settings, _ = stack
    org = f"org-launch-{uuid.uuid4().hex[:6]}"
    token, _ = await create_org_key(settings.redis_url, org, "launch")
    client = AsyncOpenAI(base_url=f"{gateway}/v1", api_key=token, max_retries=0, timeout=300)
    requests = await mixed_traffic(client, INCLUDED)
    assert all(r["cost"]["list_cost_nano_usd"] == list_cost(r) for r in requests)
    assert all(r["cost"]["promotion"] == {"id": "launch-week", "usage_multiplier": "2"}
               for r in requests)  # fmt: skip
    hand = hand_invoice(requests, INCLUDED, TEST_VERSIONS[0]["version"])
    assert hand.allowance == INCLUDED and hand.overage > 0  # crossed
    assert hand.total_cents > 0  # an invoice in whole cents, not fractions of one
    assert sum(hand.lines.values()) == hand.overage

    # The ledger worker's job; then the invoice is the hand computation.
    sync = redis.Redis.from_url(settings.redis_url)
    engine = make_engine(settings.ledger_url)
    UsageStreamConsumer(sync, engine, settings).drain(max_seconds=60)
    sync.close()
    book = load_pricebook(settings.pricebook_path)
    period = period_of(datetime.now(UTC))
    preview = invoice_preview(engine, book, org, period)
    lines = {line.key: line.amount_nano_usd for line in preview.lines if line.amount_nano_usd}
    assert lines == hand.lines
    total_cents = hand.total_cents
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
    assert sum(r["allowance_consumed_nano_usd"] for r in receipts) == hand.allowance
    assert sum(r["promotion_credit_nano_usd"] for r in receipts) == hand.covered - hand.allowance
    assert sum(r["overage_nano_usd"] for r in receipts) == hand.overage
    split = [
        r["id"] for r in receipts if r["allowance_consumed_nano_usd"] and r["overage_nano_usd"]
    ]
    crossing = hand.crossing
    assert split == ([api.get(f"/requests/{crossing}").json()["id"]] if crossing else [])
    for request in requests[:3]:
        shown = api.get(f"/requests/{request['id']}").json()
        assert (shown["input_tokens"], shown["output_tokens"]) == (
            request["prompt"],
            request["completion"],
        )
    totals = api.get(f"{gateway}/v1/usage").json()["totals"]
    assert (totals["allowance_used_nano_usd"], totals["overage_nano_usd"]) == (
        hand.allowance,
        hand.overage,
    )
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
