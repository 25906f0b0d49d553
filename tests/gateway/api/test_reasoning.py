"""``reasoning_effort`` and ``verbosity`` applied, through the real ``openai`` SDK, a real
gateway and the session's real vLLM (shared variant, cpu profile: the ``composer_tiny``
reasoning parser and serving/variants.yaml's thinking budgets).

The tiny checkpoint is random: what it thinks is noise, and it may close ``</think>``
itself before the budget. So the tests hold answers to the budgets' upper bounds, and use
a seed so that a streamed answer and an unstreamed one are the same tokens."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from serving.settings import ServingSettings
from serving.variants import load_variants
from tests.support.gateway import GatewayServer, RecordingMeter

pytestmark = pytest.mark.vllm

MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]
BUDGETS = load_variants(ServingSettings().variants_file).thinking_budgets


def chat(client: openai.OpenAI, **params: Any) -> Any:
    params = {"max_tokens": 24, "seed": 1, "temperature": 1.0, **params}
    return client.chat.completions.create(model="composer-2.5", messages=MESSAGES, **params)


def reasoning_of(message: Any) -> str | None:
    extra: dict[str, Any] = message.model_extra or {}
    return extra.get("reasoning_content")


def reasoning_tokens(usage: Any) -> int:
    details = usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens is not None
    return int(details.reasoning_tokens)


@pytest.mark.parametrize("effort", [None, "none"])
def test_no_effort_and_none_do_not_think(client: openai.OpenAI, effort: str | None) -> None:
    answer = chat(client, **({} if effort is None else {"reasoning_effort": effort}))
    message = answer.choices[0].message
    assert reasoning_of(message) is None
    assert message.content
    assert reasoning_tokens(answer.usage) == 0


def test_each_effort_thinks_within_its_budget(client: openai.OpenAI) -> None:
    minimal, low = BUDGETS["minimal"], BUDGETS["low"]
    # Room for the whole budget and an answer after it.
    short = chat(client, reasoning_effort="minimal", max_tokens=minimal + 16)
    long = chat(client, reasoning_effort="low", max_tokens=low + 16)
    for answer, budget in ((short, minimal), (long, low)):
        thought = reasoning_tokens(answer.usage)
        assert 0 < thought <= budget
        assert reasoning_of(answer.choices[0].message)
        # Reasoning is output: part of completion_tokens, next to the answer's tokens.
        assert answer.usage.completion_tokens > thought
    # The same seed thinks the same tokens until the smaller budget cuts it short.
    assert reasoning_tokens(short.usage) <= reasoning_tokens(long.usage)


def test_a_budget_above_max_tokens_ends_in_reasoning(client: openai.OpenAI) -> None:
    answer = chat(client, reasoning_effort="high", max_tokens=8)
    assert answer.choices[0].finish_reason == "length"
    assert reasoning_tokens(answer.usage) <= 8


def test_streamed_reasoning_is_the_unstreamed_one(client: openai.OpenAI) -> None:
    params: dict[str, Any] = {"reasoning_effort": "minimal", "max_tokens": BUDGETS["minimal"] + 8}
    whole = chat(client, **params)
    stream = chat(client, stream=True, stream_options={"include_usage": True}, **params)
    reasoning, content, usage = "", "", None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            reasoning += reasoning_of(choice.delta) or ""
            content += choice.delta.content or ""
            # vLLM's name for it never reaches the client.
            assert "reasoning" not in (choice.delta.model_extra or {})
    assert usage is not None
    assert reasoning == reasoning_of(whole.choices[0].message)
    assert content == whole.choices[0].message.content
    assert reasoning_tokens(usage) == reasoning_tokens(whole.usage) > 0


def test_reasoning_tokens_are_billed_as_output(
    client: openai.OpenAI, recorded: tuple[GatewayServer, RecordingMeter]
) -> None:
    _, meter = recorded
    before = len(meter.settled)
    answer = chat(client, reasoning_effort="minimal", max_tokens=BUDGETS["minimal"] + 8)
    settled = meter.wait_settled(before + 1)[-1]
    assert settled.completion_tokens == answer.usage.completion_tokens
    assert settled.completion_tokens >= reasoning_tokens(answer.usage) > 0


def test_verbosity_reaches_the_prompt(client: openai.OpenAI) -> None:
    prompt = {
        level: chat(
            client, max_tokens=1, **({"verbosity": level} if level else {})
        ).usage.prompt_tokens
        for level in (None, "low", "medium", "high")
    }
    # medium is the template's default; low and high each add their own system line.
    assert prompt["medium"] == prompt[None]
    assert prompt["low"] > prompt[None] and prompt["high"] > prompt[None]
    assert prompt["low"] != prompt["high"]


def test_thinking_opens_the_prompt(client: openai.OpenAI) -> None:
    """The template opens <think> for an effort that thinks: one more prompt token."""
    plain = chat(client, max_tokens=1).usage.prompt_tokens
    thinking = chat(client, max_tokens=1, reasoning_effort="low").usage.prompt_tokens
    assert thinking == plain + 1
