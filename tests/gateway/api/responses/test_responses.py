"""``POST /v1/responses`` through the real ``openai`` SDK (``responses.create`` and
``responses.stream``), a real gateway and the session's real vLLM: text, reasoning,
verbosity, tools over two turns, ``service_tier``, refusals, and the usage settled for
billing being the usage the client was shown (the ledger and ``GET /v1/usage`` side is
tests/billing/test_responses_billing.py).

The tiny checkpoint is random: answers are noise, so the tests hold them to their shapes,
their budgets and the named tool a forced ``tool_choice`` makes vLLM call. They sample
greedily (responses take no seed): the same noise every run, which runs past the small
``max_output_tokens`` the tests set instead of ending at an end-of-text token."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from serving.settings import ServingSettings
from serving.variants import load_variants
from tests.support.gateway import WEATHER_TOOL, GatewayServer, RecordingMeter

pytestmark = pytest.mark.vllm

BUDGETS = load_variants(ServingSettings().variants_file).thinking_budgets
TOOL = {"type": "function", **WEATHER_TOOL["function"]}


def create(client: openai.OpenAI, **params: Any) -> Any:
    params = {"input": "Say hello.", "max_output_tokens": 12, "temperature": 0, **params}
    return client.responses.create(model="composer-2.5", **params)


def settled_for(meter: RecordingMeter, response_id: str) -> Any:
    request_id = "req_" + response_id.removeprefix("resp_")
    (report,) = [r for r in meter.wait_settled(1) if r.request_id == request_id]
    return report


def test_a_response_answers_in_a_message_and_bills_its_usage(
    client: openai.OpenAI, recorded: tuple[GatewayServer, RecordingMeter]
) -> None:
    raw = client.responses.with_raw_response.create(
        model="composer-2.5",
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=6,
        temperature=0,
    )
    response = raw.parse()
    assert response.object == "response" and response.model == "composer-2.5"
    assert response.id == "resp_" + raw.headers["x-request-id"].removeprefix("req_")
    assert response.status == "incomplete"  # 6 tokens of noise reach max_output_tokens
    assert response.incomplete_details and response.incomplete_details.reason == "max_output_tokens"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text != ""
    assert response.store is False and response.instructions == "Be brief."
    # The default tier is fast, answered as OpenAI names it.
    assert response.service_tier == "priority" and raw.headers["x-cstack-tier"] == "fast"
    usage = response.usage
    assert usage is not None and usage.output_tokens == 6
    _, meter = recorded
    report = settled_for(meter, response.id)
    assert (report.prompt_tokens, report.completion_tokens) == (
        usage.input_tokens,
        usage.output_tokens,
    )
    assert report.outcome == "complete" and report.tier == "fast"


def test_reasoning_effort_thinks_within_its_budget_in_a_reasoning_item(
    client: openai.OpenAI,
) -> None:
    budget = BUDGETS["minimal"]
    response = create(client, reasoning={"effort": "minimal"}, max_output_tokens=budget + 16)
    kinds = [item.type for item in response.output]
    assert kinds[0] == "reasoning" and "message" in kinds
    assert response.output[0].content and response.output[0].content[0].text
    thought = response.usage.output_tokens_details.reasoning_tokens
    assert 0 < thought <= budget
    assert response.usage.output_tokens >= thought  # reasoning is output, billed as output
    assert response.reasoning is not None and response.reasoning.effort == "minimal"
    plain = create(client)
    assert [item.type for item in plain.output] == ["message"]
    assert plain.usage.output_tokens_details.reasoning_tokens == 0


def test_verbosity_reaches_the_template(client: openai.OpenAI) -> None:
    """The verbosity line is in the prompt: more input tokens than without it."""
    low = create(client, text={"verbosity": "low"}, max_output_tokens=1)
    plain = create(client, max_output_tokens=1)
    assert low.text is not None and low.text.verbosity == "low"
    assert low.usage.input_tokens > plain.usage.input_tokens


def test_a_stream_delivers_the_response_its_events_built(
    client: openai.OpenAI, recorded: tuple[GatewayServer, RecordingMeter]
) -> None:
    with client.responses.stream(
        model="composer-2.5",
        input="Tell a story.",
        max_output_tokens=10,
        reasoning={"effort": "minimal"},
        temperature=0,
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # 10 tokens of noise: cut by max_output_tokens. (The SDK's get_final_response()
    # takes only response.completed, as with OpenAI's own incomplete responses.)
    assert kinds[-1] == "response.incomplete"
    final = events[-1].response
    assert "response.reasoning_text.delta" in kinds
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert final.output[0].type == "reasoning" and final.output[0].content[0].text == deltas
    assert final.usage is not None and final.usage.output_tokens == 10
    _, meter = recorded
    assert settled_for(meter, final.id).completion_tokens == 10


def test_a_forced_tool_is_called_and_its_output_answered_next_turn(
    client: openai.OpenAI,
) -> None:
    first = create(
        client,
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
    )
    # The named choice makes vLLM call that function. (vLLM's CPU build does not hold the
    # arguments to the schema, and the random model may run past max_output_tokens inside
    # them: only their type is checked.)
    calls = [item for item in first.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_weather"]
    assert isinstance(calls[0].arguments, str) and calls[0].call_id
    with client.responses.stream(
        model="composer-2.5",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
        ],
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64,
    ) as stream:
        events = list(stream)
    assert events[-1].type in ("response.completed", "response.incomplete")
    second = events[-1].response
    assert [item.type for item in second.output][-1] == "function_call"
    assert second.usage is not None
    # The second turn's prompt holds the first turn, its call and the call's output.
    assert second.usage.input_tokens > first.usage.input_tokens


def test_service_tier_picks_the_standard_tier(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model="composer-2.5", input="Hi.", max_output_tokens=2, service_tier="default"
    )
    assert raw.headers["x-cstack-tier"] == "standard"
    assert raw.parse().service_tier == "default"


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_0"}, "previous_response_id"),
        ({"max_output_tokens": 10**9}, "max_output_tokens"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ],
)
def test_what_cannot_be_served_is_a_400_the_sdk_raises(
    client: openai.OpenAI, params: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**{"model": "composer-2.5", "input": "Hi.", **params})
    assert refused.value.param == param
    assert param in refused.value.message
