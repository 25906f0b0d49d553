"""Admission reserves an upper bound of the prompt tokens of every shape the Responses API
translates, checked against what the real vLLM counts: bare function tools (vLLM renders
the fields they leave out as nulls), instructions and many short input items (less JSON
than the chat messages they become)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.gateway import GatewayServer, RecordingMeter

pytestmark = pytest.mark.vllm


def _reserved_and_billed(
    recorded: tuple[GatewayServer, RecordingMeter], client: openai.OpenAI, **fields: Any
) -> tuple[int, int]:
    _, meter = recorded
    before = len(meter.settled)
    client.responses.create(model="composer-2.5", max_output_tokens=2, temperature=0, **fields)
    [usage] = meter.wait_settled(before + 1)[before:]
    return meter.admitted[-1].prompt_tokens, usage.prompt_tokens


def test_bare_function_tools(
    recorded: tuple[GatewayServer, RecordingMeter], client: openai.OpenAI
) -> None:
    tools: Any = [{"type": "function", "name": f"f{i}"} for i in range(34)]
    reserved, billed = _reserved_and_billed(recorded, client, input="hi", tools=tools)
    assert billed <= reserved, (billed, reserved)


def test_instructions_and_many_short_items(
    recorded: tuple[GatewayServer, RecordingMeter], client: openai.OpenAI
) -> None:
    items: Any = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(60)
    ]
    items.append({"role": "user", "content": "y"})
    reserved, billed = _reserved_and_billed(recorded, client, input=items, instructions="z")
    assert billed <= reserved, (billed, reserved)
    reserved, billed = _reserved_and_billed(recorded, client, input="a", instructions="b")
    assert billed <= reserved, (billed, reserved)
