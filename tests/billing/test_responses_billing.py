"""``POST /v1/responses`` is billed as chat completions are: a real gateway process with
billing's real Meter in front of the session's vLLM, the openai SDK's ``responses.create``
and ``responses.stream`` (reasoning on, one on each tier), then the ledger worker's job
and ``GET /v1/usage``: the ledger holds exactly the tokens each response reported, and its
money is those tokens at the price book's prices for the tier that served them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from openai import OpenAI

from billing.ledger import make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from tests.support.billing import create_org_key, usage_entries
from tests.support.gateway_processes import gateway_processes

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture
def gateway_url(billing_settings: BillingSettings, vllm_url: str, tmp_path: Path) -> Iterator[str]:
    with gateway_processes(billing_settings.model_dump(), vllm_url, tmp_path, count=1) as urls:
        yield urls[0]


async def test_responses_are_metered_into_the_ledger_and_usage(
    gateway_url: str, billing_settings: BillingSettings
) -> None:
    token, _ = await create_org_key(billing_settings.redis_url, "org-responses", "metered")
    client = OpenAI(base_url=f"{gateway_url}/v1", api_key=token, max_retries=0)

    created = client.responses.create(
        model="composer-2.5",
        input="Say hello.",
        reasoning={"effort": "minimal"},
        max_output_tokens=20,
        temperature=0,  # greedy: the same thinking every run (responses take no seed)
    )
    with client.responses.stream(
        model="composer-2.5", input="Tell a story.", max_output_tokens=9, service_tier="default"
    ) as stream:
        streamed = list(stream)[-1].response
    shown = {"fast": created.usage, "standard": streamed.usage}
    assert all(usage is not None for usage in shown.values())

    sync = redis.Redis.from_url(billing_settings.redis_url)
    events = {
        json.loads(fields[b"event"])["tier"]: json.loads(fields[b"event"])
        for _, fields in usage_entries(sync, billing_settings)
    }
    assert set(events) == {"fast", "standard"}
    book = load_pricebook(billing_settings.pricebook_path).versions[-1]
    for tier, usage in shown.items():
        event = events[tier]
        assert usage is not None
        assert (event["prompt_tokens"], event["completion_tokens"]) == (
            usage.input_tokens,
            usage.output_tokens,
        )
        prices = book.tiers[tier]
        assert event["list_cost_nano_usd"] == (
            usage.input_tokens * prices.input + usage.output_tokens * prices.output
        )
    assert created.usage is not None and created.usage.output_tokens_details.reasoning_tokens > 0

    engine = make_engine(billing_settings.ledger_url)
    migrate(engine)
    UsageStreamConsumer(sync, engine, billing_settings).drain(max_seconds=30)
    usage = httpx.get(
        f"{gateway_url}/v1/usage", headers={"authorization": f"Bearer {token}"}, timeout=30
    )
    assert usage.status_code == 200, usage.text
    totals = usage.json()["totals"]
    assert totals["requests"] == 2
    assert totals["prompt_tokens"] == sum(u.input_tokens for u in shown.values() if u)
    assert totals["completion_tokens"] == sum(u.output_tokens for u in shown.values() if u)
    assert totals["list_cost_nano_usd"] == sum(e["list_cost_nano_usd"] for e in events.values())
