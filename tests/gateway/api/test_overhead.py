"""The gateway reports its own overhead: ``x-cstack-overhead-ms`` on every answer (time in
the gateway outside the upstream) and the ``cstack_gateway_overhead_seconds`` histogram,
checked against the time the client itself measured, with the real vLLM upstream."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.gateway import GatewayServer, RecordingMeter, metric_value

pytestmark = pytest.mark.vllm


def test_answers_and_streams_carry_the_gateways_overhead(
    recorded: tuple[GatewayServer, RecordingMeter], api_key: str
) -> None:
    gateway, _ = recorded
    headers = {"authorization": f"Bearer {api_key}"}
    body = {
        "model": "composer-2.5",
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 32,
        "ignore_eos": True,
    }
    count_before = metric_value(
        httpx.get(f"{gateway.internal_url}/metrics").text,
        "cstack_gateway_overhead_seconds_count",
        tier="fast",
    )
    started = time.perf_counter()
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    client_ms = (time.perf_counter() - started) * 1000
    assert answer.status_code == 200
    overhead_ms = float(answer.headers["x-cstack-overhead-ms"])
    # 32 tokens from the engine take far longer than the gateway's own part: the header
    # is the time outside the upstream, not the request's whole time.
    assert 0 < overhead_ms < client_ms / 2, (overhead_ms, client_ms)

    with httpx.stream(
        "POST",
        f"{gateway.url}/v1/chat/completions",
        json={**body, "stream": True},
        headers=headers,
        timeout=60,
    ) as stream:
        assert stream.status_code == 200
        assert float(stream.headers["x-cstack-overhead-ms"]) > 0
        assert [line for line in stream.iter_lines() if line.startswith("data: ")]

    metrics = httpx.get(f"{gateway.internal_url}/metrics").text
    count = metric_value(metrics, "cstack_gateway_overhead_seconds_count", tier="fast")
    assert count == count_before + 2
