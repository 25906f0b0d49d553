"""A non-streaming answer is assembled from vLLM's stream (so that tokens are billed however
the request ends); it must be what vLLM itself answers unstreamed, key for key and value
for value, for chat and text completions: text and messages, tool calls, logprobs, finish
and stop reasons, token ids, usage. Null fields aside: the gateway leaves out those that
OpenAI's schema lets be absent but not null (test_openai_schema checks the shape)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import httpx
import pytest

from tests.support.gateway import WEATHER_TOOL, GatewayServer

pytestmark = pytest.mark.vllm

CHAT = {"model": "composer-2.5", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5, "temperature": 0}  # fmt: skip
COMPLETION = {"model": "composer-2.5", "prompt": "Once upon", "max_tokens": 4, "temperature": 0}
TOOLS = [WEATHER_TOOL]
SAMPLED = {"n": 4, "seed": 7, "temperature": 1.0, "max_tokens": 64}

CASES = [
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions", {**CHAT, "n": 2, "seed": 3, "temperature": 1.0, "logprobs": True,
                              "top_logprobs": 2}),
    ("/v1/chat/completions", {**CHAT, "return_token_ids": True, "logprobs": True}),
    ("/v1/chat/completions", {**CHAT, **SAMPLED, "tools": TOOLS,
                              "tool_choice": {"type": "function",
                                              "function": {"name": "get_weather"}}}),
    ("/v1/chat/completions", {**CHAT, **SAMPLED, "tools": TOOLS, "tool_choice": "auto"}),
    # What the RL rollout workers send: tools, and the exact tokens and their logprobs.
    ("/v1/chat/completions", {**CHAT, "max_tokens": 64, "tools": TOOLS, "logprobs": True,
                              "return_token_ids": True}),
    ("/v1/completions", COMPLETION),
    ("/v1/completions", {**COMPLETION, "prompt": ["a b", "c"], "n": 2, "seed": 1,
                         "temperature": 1.0, "logprobs": 1}),
    ("/v1/completions", {**COMPLETION, "prompt": [[1, 2, 3], [4]], "echo": True, "logprobs": 2,
                         "return_token_ids": True}),
    ("/v1/completions", {**COMPLETION, "prompt": [5, 6, 7], "stop": ["a"],
                         "return_token_ids": True}),
]  # fmt: skip

#: Differ by design: ids are random per request; the gateway rewrites model and tier.
VARYING = {"id", "created", "model", "service_tier"}
#: vLLM's own extension, computed for echo + logprobs but never streamed (the prompt's
#: logprobs are in ``logprobs`` either way).
NOT_STREAMED = {"prompt_logprobs"}


def comparable(value: Any) -> Any:
    if isinstance(value, dict):
        # Null fields are compared as absent: see the module docstring. (vLLM's streamed
        # usage also leaves out its null extension fields of prompt_tokens_details.)
        out = {
            k: comparable(v)
            for k, v in value.items()
            if k not in VARYING | NOT_STREAMED and v is not None
        }
        if isinstance(out.get("arguments"), str):
            # vLLM's unstreamed tool parser re-serialises the arguments it parsed; streamed,
            # they are the model's own text. Either way the same JSON value.
            with contextlib.suppress(ValueError):
                out["arguments"] = json.loads(out["arguments"])
        return out
    if isinstance(value, list):
        return [comparable(item) for item in value]
    return value


@pytest.mark.parametrize(("path", "body"), CASES, ids=[f"{p[4:]}-{i}" for i, (p, _) in
                                                       enumerate(CASES)])  # fmt: skip
def test_assembled_answer_is_vllms_unstreamed_answer(
    gateway: GatewayServer, vllm_url: str, api_key: str, path: str, body: dict[str, Any]
) -> None:
    direct = httpx.post(f"{vllm_url}{path}", json=body, timeout=120)
    assert direct.status_code == 200, direct.text
    relayed = httpx.post(
        f"{gateway.url}{path}",
        json=body,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=120,
    )
    assert relayed.status_code == 200, relayed.text
    answer = relayed.json()
    assert (answer["model"], answer["service_tier"]) == ("composer-2.5", "priority")
    assert comparable(answer) == comparable(direct.json())
    if body.get("tools") and answer["choices"][0]["finish_reason"] != "length":
        assert answer["choices"][0]["message"]["tool_calls"][0]["id"]
