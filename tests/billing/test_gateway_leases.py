"""A busy key through two real gateway processes with the real Meter (and the openai SDK):
its requests are admitted on leases (``billing.meter.leases``), and the money is
exactly what was metered: one usage event per answered request, the budget's ``used`` their sum and
nothing left reserved once the gateways have stopped and given their leases back.

The upstream is the fast stand-in (tests.support.fakes.upstream): a key gets a lease only when
it sends several requests a second, more than CPU vLLM answers here. Each request asks for
its own ``max_tokens``: a lease admits requests of any shape.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
import redis
from openai import AsyncOpenAI

from billing.settings import BillingSettings
from serving.process import free_port
from tests.support.billing import create_org_key, keyspace, usage_entries
from tests.support.gateway_processes import gateway_processes

pytestmark = pytest.mark.asyncio(loop_scope="session")
ORG = "org-busy-key"
CLIENTS, EACH = 6, 25


def admitted_on_leases(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    found = re.search(r'^cstack_admission_leases_total\{outcome="admitted"\} (\S+)$', text, re.M)
    assert found, "the gateway's /metrics has no cstack_admission_leases_total"
    return float(found.group(1))


async def test_a_busy_key_is_admitted_on_leases_and_billed_exactly(
    billing_settings: BillingSettings, usage_upstream: str, tmp_path: Path
) -> None:
    token, _ = await create_org_key(billing_settings.redis_url, ORG, "metered")

    values = {**billing_settings.model_dump(), "redis_timeout_s": 15, "engine_admission": False}
    metrics_ports = [free_port(), free_port()]
    with gateway_processes(values, usage_upstream, tmp_path, internal_ports=metrics_ports) as urls:
        clients = [AsyncOpenAI(base_url=f"{url}/v1", api_key=token) for url in urls]

        async def client_loop(index: int) -> list[tuple[str, dict[str, str]]]:
            answered = []
            for turn in range(EACH):
                raw = await clients[index % 2].chat.completions.with_raw_response.create(
                    model="composer-2.5",
                    messages=[{"role": "user", "content": "the same question"}],
                    max_tokens=4 + (index * EACH + turn) % 13,
                )
                answered.append((raw.headers["x-request-id"], dict(raw.headers)))
            return answered

        results = await asyncio.gather(*(client_loop(i) for i in range(CLIENTS)))
        answered = [one for loop in results for one in loop]
        taken = sum(admitted_on_leases(port) for port in metrics_ports)
        for client in clients:
            await client.close()
    # Every answer carried its rate-limit figures, some of them admitted on a lease.
    assert all("x-ratelimit-remaining-requests" in headers for _, headers in answered)
    assert taken > 0

    sync = redis.Redis.from_url(billing_settings.redis_url)
    events = [json.loads(fields[b"event"]) for _, fields in usage_entries(sync, billing_settings)]
    assert sorted(e["event_id"] for e in events) == sorted(rid for rid, _ in answered)
    period = events[0]["started_at"][:7]
    prefix = keyspace(billing_settings).budget_prefix(ORG) + period
    budget = {k.decode(): int(v) for k, v in sync.hgetall(prefix).items()}
    assert budget == {
        "reserved": 0,
        "used": sum(e["allowance_cost_nano_usd"] for e in events),
    }
    assert sync.hlen(f"{prefix}:resv-amount") == 0
