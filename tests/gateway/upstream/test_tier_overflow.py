"""The overflow policy between production pools, against real vLLM: when the fast pool is
full, a fast request of an org that allows it is served by the standard pool, answered
and billed as standard; an org that does not allow it waits for fast (then a 503).

The fast pool here is a stalled engine (healthy, never answers), so the requests sent to
it hold its slots for as long as the test needs; the standard pool is the real vLLM.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from serving.profile import detect_profile
from serving.settings import ServingSettings
from serving.variants import load_variants
from tests.support.fakes.replica import Forwarder
from tests.support.gateway import (
    ADMIN_TOKEN,
    GatewayServer,
    RecordingMeter,
    cstack_keys,
    metric_value,
)
from tests.support.waits import wait_until

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
HI = {"model": "composer-2.5", "messages": MESSAGES, "max_tokens": 2}


def org_key(gateway: GatewayServer, org_id: str, **settings: Any) -> str:
    created = httpx.post(
        f"{gateway.internal_url}/admin/orgs", json={"org_id": org_id, **settings}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    key = httpx.post(f"{gateway.internal_url}/admin/orgs/{org_id}/keys", headers=ADMIN)
    return str(key.json()["key"])


def fill(gateway: GatewayServer, key: str, requests: int) -> list[threading.Thread]:
    """``requests`` fast requests that hold the stalled fast engine's slots until it dies."""

    def hold() -> None:
        # The stalled engine is killed at the end of the test: these then fail.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                f"{gateway.url}/v1/chat/completions",
                json=HI,
                headers={"authorization": f"Bearer {key}"},
                timeout=120,
            )

    threads = [threading.Thread(target=hold, daemon=True) for _ in range(requests)]
    for thread in threads:
        thread.start()
    metrics = f"{gateway.internal_url}/metrics"
    wait_until(
        lambda: (
            metric_value(httpx.get(metrics).text, "cstack_inflight_requests", tier="fast")
            >= requests
        ),
        "the fast requests to reach the fast engine",
        timeout_s=30,
    )
    return threads


def test_a_full_fast_pool_overflows_to_standard_only_where_the_org_allows_it(
    start_gateway: Any, forwarders: Any, vllm_url: str
) -> None:
    stalled: Forwarder = forwarders(hang=True)
    meter = RecordingMeter()
    gateway: GatewayServer = start_gateway(
        meter=meter, fast_upstream_urls=[stalled.url], standard_upstream_urls=[vllm_url]
    )
    book = load_variants(ServingSettings().variants_file)
    fast_slots = book.max_num_seqs("fast", detect_profile(ServingSettings().serving_profile))
    assert fast_slots is not None
    flexible = org_key(gateway, "overflow-co", fast_overflow=True)
    strict = org_key(gateway, "fast-only-co")
    threads = fill(gateway, strict, fast_slots)

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=flexible, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="composer-2.5", messages=MESSAGES, max_tokens=2, service_tier="priority"
    )
    answer = raw.parse()
    assert raw.headers["x-cstack-tier"] == "standard"
    assert answer.service_tier == "default"  # OpenAI's name for standard processing
    assert answer.model == "composer-2.5" and answer.usage and answer.usage.completion_tokens
    [usage] = [u for u in meter.wait_settled(1) if u.org_id == "overflow-co"]
    assert usage.tier == "standard" and usage.outcome == "complete"  # billed as served
    metrics = httpx.get(f"{gateway.internal_url}/metrics").text
    assert metric_value(metrics, "cstack_tier_overflows_total") == 1

    # A stream overflows alike, and names the tier in every chunk.
    chunks = list(
        client.chat.completions.create(
            model="composer-2.5",
            messages=MESSAGES,
            max_tokens=2,
            stream=True,
            extra_body={"service_tier": "fast"},
        )
    )
    assert chunks and {chunk.service_tier for chunk in chunks} == {"default"}

    # The org that did not opt in waits for fast, then is told to retry.
    waited = time.monotonic()
    refused = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=HI,
        headers={"authorization": f"Bearer {strict}"},
        timeout=120,
    )
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "engine_overloaded"
    assert time.monotonic() - waited >= book.slot_sharing.max_queue_wait_s["fast"] - 1
    stalled.kill()
    for thread in threads:
        thread.join(timeout=30)


def test_overflow_is_set_per_org_by_admin_api_and_cli(
    gateway: GatewayServer, redis_url: str
) -> None:
    created = httpx.post(
        f"{gateway.internal_url}/admin/orgs", json={"org_id": "flex-co"}, headers=ADMIN
    )
    assert created.status_code == 201 and created.json()["fast_overflow"] is False
    patched = httpx.patch(
        f"{gateway.internal_url}/admin/orgs/flex-co", json={"fast_overflow": True}, headers=ADMIN
    )
    assert patched.status_code == 200 and patched.json()["fast_overflow"] is True
    assert patched.json()["default_tier"] == "fast"  # a field left out keeps its value
    wrong = httpx.patch(
        f"{gateway.internal_url}/admin/orgs/flex-co", json={"fast_overflow": "yes"}, headers=ADMIN
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "fast_overflow"

    off = cstack_keys(redis_url, "fast-overflow", "flex-co", "off")
    assert off.exit_code == 0 and "fast overflow to standard off" in off.stdout
    org = httpx.get(f"{gateway.internal_url}/admin/orgs/flex-co", headers=ADMIN).json()
    assert org["fast_overflow"] is False
    unknown = cstack_keys(redis_url, "fast-overflow", "nobody-co", "on")
    assert unknown.exit_code != 0 and "unknown org" in unknown.output
    bad = cstack_keys(redis_url, "fast-overflow", "flex-co", "maybe")
    assert bad.exit_code != 0
