"""Receipts through a real gateway process (billing's real Meter and ledger reader) in front
of the session's vLLM, driven by the openai SDK: every answer carries its cost in
``usage.cstack_cost``, and once the ledger worker's job is done each request has a receipt
with the tokens and the cost its answer showed, found by its response id, by its
``x-request-id`` (the gateway's, or the client's own) and in the month's CSV, for its own
org only."""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from openai import OpenAI

from billing.ledger import make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.prices.periods import period_of
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from tests.support.billing import create_org_key
from tests.support.gateway_processes import gateway_processes

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture
def gateway_url(billing_settings: BillingSettings, vllm_url: str, tmp_path: Path) -> Iterator[str]:
    with gateway_processes(billing_settings.model_dump(), vllm_url, tmp_path, count=1) as urls:
        yield urls[0]


def cost_of(usage: Any) -> dict[str, Any]:
    """``usage.cstack_cost`` as the openai SDK keeps an extension field."""
    assert usage is not None and usage.model_extra, usage
    return dict(usage.model_extra["cstack_cost"])


async def test_every_answer_has_its_cost_and_every_request_a_receipt(
    gateway_url: str, billing_settings: BillingSettings
) -> None:
    org = f"org-receipts-{uuid.uuid4().hex[:6]}"
    token, _ = await create_org_key(billing_settings.redis_url, org, "metered")
    client = OpenAI(base_url=f"{gateway_url}/v1", api_key=token, max_retries=0)
    book = load_pricebook(billing_settings.pricebook_path).versions[-1]

    thought = client.chat.completions.with_raw_response.create(
        model="composer-2.5",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=80,
        seed=1,
        temperature=1.0,
        reasoning_effort="minimal",
        extra_headers={"x-request-id": "client-abc"},
    )
    assert thought.headers["x-request-id"] == "client-abc"  # the client's own, echoed
    chat = thought.parse()
    chunks = list(
        client.chat.completions.create(
            model="composer-2.5-standard",
            messages=[{"role": "user", "content": "count"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = client.completions.with_raw_response.create(
        model="composer-2.5", prompt=["a b", "c"], n=2, max_tokens=5, seed=1, temperature=1.0
    )
    gateway_id = texts.headers["x-request-id"]  # no client id: the gateway's own
    completion = texts.parse()
    response = client.responses.create(model="composer-2.5", input="Hi.", max_output_tokens=8)

    answers = {
        chat.id: (chat.usage, "fast"),
        chunks[-1].id: (chunks[-1].usage, "standard"),
        completion.id: (completion.usage, "fast"),
    }
    for usage, tier in answers.values():
        cost = cost_of(usage)
        prices = book.tiers[tier]  # type: ignore[index]
        assert cost["list_cost_nano_usd"] == (
            usage.prompt_tokens * prices.input + usage.completion_tokens * prices.output
        )
        assert cost["price_version"] == book.version and cost["currency"] == "usd"
    assert all(chunk.usage is None for chunk in chunks[:-1])  # only the final chunk's
    assert cost_of(response.usage)["list_cost_nano_usd"] == (
        response.usage.input_tokens * book.tiers["fast"].input  # type: ignore[union-attr]
        + response.usage.output_tokens * book.tiers["fast"].output  # type: ignore[union-attr]
    )

    sync = redis.Redis.from_url(billing_settings.redis_url)
    engine = make_engine(billing_settings.ledger_url)
    migrate(engine)
    UsageStreamConsumer(sync, engine, billing_settings).drain(max_seconds=30)
    sync.close()
    api = httpx.Client(
        base_url=f"{gateway_url}/v1/usage", headers={"authorization": f"Bearer {token}"}
    )
    listed = api.get("/requests", params={"limit": 3})
    assert listed.status_code == 200, listed.text
    assert listed.json()["has_more"] is True
    rest = api.get("/requests", params={"after": listed.json()["last_id"]}).json()
    receipts = listed.json()["data"] + rest["data"]
    assert len(receipts) == 4 and rest["has_more"] is False

    def receipt(wanted: str) -> dict[str, Any]:
        found = api.get(f"/requests/{wanted}")
        assert found.status_code == 200, found.text
        return dict(found.json())

    for answer_id, (usage, tier) in answers.items():
        shown = receipt(answer_id)
        assert (shown["input_tokens"], shown["output_tokens"], shown["tier"]) == (
            usage.prompt_tokens,
            usage.completion_tokens,
            tier,
        )
        assert shown["list_cost_nano_usd"] == cost_of(usage)["list_cost_nano_usd"]
        assert cost_of(usage)["receipt"] == f"/v1/usage/requests/{shown['id']}"
        assert shown["overage_nano_usd"] == 0  # well inside the plan's $1.00
        assert shown["allowance_consumed_nano_usd"] == shown["allowance_cost_nano_usd"]
    reasoning = chat.usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]
    assert receipt("client-abc")["reasoning_tokens"] == reasoning > 0
    assert receipt("client-abc")["x_request_id"] == "client-abc"
    assert receipt(gateway_id)["id"] == gateway_id
    assert receipt(response.id)["input_tokens"] == response.usage.input_tokens  # type: ignore[union-attr]
    assert [
        r["tier"] for r in api.get("/requests", params={"tier": "standard"}).json()["data"]
    ] == ["standard"]

    # Another org's key sees none of it.
    other, _ = await create_org_key(billing_settings.redis_url, f"{org}-other", "metered")
    stranger = {"authorization": f"Bearer {other}"}
    assert api.get(f"/requests/{chat.id}", headers=stranger).status_code == 404
    assert api.get("/requests", headers=stranger).json()["data"] == []

    period = period_of(datetime.now(UTC))
    exported = api.get("/requests.csv", params={"period": period})
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert sorted(row["id"] for row in rows) == sorted(r["id"] for r in receipts)

    for params, param in (
        ({"limit": "0"}, "limit"),
        ({"tier": "turbo"}, "tier"),
        ({"start_time": "yesterday"}, "start_time"),
        ({"after": "req_nobody"}, "after"),
    ):
        refused = api.get("/requests", params=params)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == param
    bad_period = api.get("/requests.csv", params={"period": "2026-13"})
    assert (bad_period.status_code, bad_period.json()["error"]["param"]) == (400, "period")
    api.close()
