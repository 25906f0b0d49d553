"""Episodes through the platform's own API: the gateway relays vLLM's token ids and
logprobs, so rollouts in production (CSTACK_RL_POLICY_URL = the gateway) keep them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from redis.asyncio import Redis

from serving.process import free_port

FIXTURE = Path(__file__).parents[1] / "tasks" / "fixture_repo"


@pytest.fixture
def gateway_url(redis_url: str, vllm_url: str) -> Iterator[str]:
    from billing.contract import UnmeteredMeter, UnmeteredUsageReader
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    settings = GatewaySettings(port=free_port(), redis_url=redis_url, upstream_url=vllm_url,
                               admin_token="rl-test-admin")  # fmt: skip
    app = create_app(settings, UnmeteredMeter(), UnmeteredUsageReader())
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "gateway did not start"
    try:
        yield f"http://127.0.0.1:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def _api_key(redis_url: str) -> str:
    from gateway import KeyStore

    async def create() -> str:
        redis = Redis.from_url(redis_url)
        try:
            store = KeyStore(redis, "default")
            if await store.get_org("rl-rollouts") is None:
                await store.create_org("rl-rollouts")
            token, _ = await store.create_key("rl-rollouts")
            return token
        finally:
            await redis.aclose()  # type: ignore[attr-defined]

    return asyncio.run(create())


@pytest.mark.vllm
def test_episode_through_the_gateway_keeps_token_ids(gateway_url: str, redis_url: str) -> None:
    from training.rl.agent import (
        EpisodeConfig,
        PolicyClient,
        SamplingConfig,
        fixed_version,
        run_episode,
    )

    client = PolicyClient(
        f"{gateway_url}/v1",
        _api_key(redis_url),
        SamplingConfig(max_tokens=8, extra_body={"service_tier": "standard"}),
    )
    result = run_episode(client, fixed_version(0), FIXTURE, "Implement to_roman.",
                         EpisodeConfig(max_turns=1))  # fmt: skip
    client.close()
    (turn,) = result.turns
    assert turn.prompt_token_ids and len(turn.prompt_token_ids) > 100  # tools in the template
    assert 0 < len(turn.completion_token_ids) == len(turn.completion_logprobs) <= 8


@pytest.mark.vllm
def test_a_tasks_effort_and_verbosity_reach_the_model(gateway_url: str, redis_url: str) -> None:
    """Through the real gateway and vLLM: the tiny template renders verbosity as a system
    line and opens ``<think>`` for an effort that thinks, so the prompt the model saw
    (its token ids, returned) shows each setting arrived, and only when set."""
    from training.rl.agent import PolicyClient, SamplingConfig

    client = PolicyClient(
        f"{gateway_url}/v1", _api_key(redis_url), SamplingConfig(max_tokens=4, temperature=0.0)
    )
    messages = [{"role": "user", "content": "hello"}]
    plain = client.complete(messages, [])
    assert client.styled(None, None) is client
    thinking = client.styled("low", None).complete(messages, [])
    terse = client.styled(None, "low").complete(messages, [])
    assert len(thinking.prompt_token_ids) == len(plain.prompt_token_ids) + 1  # <think>
    assert thinking.prompt_token_ids[:-1] == plain.prompt_token_ids
    assert len(terse.prompt_token_ids) > len(plain.prompt_token_ids)  # "Answer tersely."
