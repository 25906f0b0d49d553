"""The official openai SDK, sync and async, against the gateway in front of a real vLLM."""

from __future__ import annotations

import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.support.gateway import GatewayServer

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Say hello."}]
#: The tiny model's random weights can sample its end-of-text token within a few tokens (a
#: fresh-clone run ended a 3-token stream with "stop"): tests that count tokens ignore it.
RUN_TO_MAX_TOKENS = {"ignore_eos": True}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["paris", "rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(gateway: GatewayServer, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)


@pytest.fixture
def async_client(gateway: GatewayServer, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)


def test_models_lists_the_public_ids(client: openai.OpenAI) -> None:
    ids = {model.id for model in client.models.list()}
    assert ids == {"composer-2.5", "composer-2.5-fast", "composer-2.5-standard"}


def test_chat_defaults_to_fast_tier(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="composer-2.5", messages=MESSAGES, max_tokens=4)
    assert isinstance(response, ChatCompletion)
    assert response.model == "composer-2.5"
    assert response.service_tier == "priority"  # OpenAI's name of our fast tier
    assert response.usage is not None and response.usage.completion_tokens <= 4
    assert response.choices[0].message.role == "assistant"


@pytest.mark.parametrize(
    ("model", "service_tier", "served"),
    [
        ("composer-2.5", "standard", "default"),  # OpenAI's name of our standard tier
        ("composer-2.5", "flex", "default"),
        ("composer-2.5-standard", None, "default"),
        ("composer-2.5-fast", "standard", "priority"),
    ],
)
def test_tier_served_is_echoed(
    client: openai.OpenAI, model: str, service_tier: str | None, served: str
) -> None:
    extra = {"service_tier": service_tier} if service_tier else {}
    response = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, **extra)
    assert response.model == model
    assert response.service_tier == served


def test_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="composer-2.5-standard",
            messages=MESSAGES,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=RUN_TO_MAX_TOKENS,
        )
    )
    assert all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
    assert {chunk.model for chunk in chunks} == {"composer-2.5-standard"}
    assert {chunk.service_tier for chunk in chunks} == {"default"}
    # OpenAI's shape: usage only on the final, choice-less chunk.
    assert all(chunk.usage is None for chunk in chunks[:-1])
    final = chunks[-1]
    assert final.choices == [] and final.usage is not None
    assert final.usage.completion_tokens == 5
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(text, str)


def test_stream_without_usage_has_none(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="composer-2.5",
            messages=MESSAGES,
            max_tokens=3,
            stream=True,
            extra_body=RUN_TO_MAX_TOKENS,
        )
    )
    assert chunks and all(chunk.usage is None and chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sampling_parameters_pass_through(client: openai.OpenAI) -> None:
    kwargs = {
        "model": "composer-2.5",
        "messages": MESSAGES,
        "max_tokens": 6,
        "n": 2,
        "seed": 1234,
        "temperature": 1.0,
        "logprobs": True,
        "top_logprobs": 2,
        "stop": ["\n\n\n"],
    }
    first = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    second = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    assert len(first.choices) == 2
    assert [c.message.content for c in first.choices] == [c.message.content for c in second.choices]
    logprobs = first.choices[0].logprobs
    assert logprobs is not None and logprobs.content
    assert all(len(entry.top_logprobs) == 2 for entry in logprobs.content)


def test_named_tool_choice_returns_a_parsed_tool_call(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="composer-2.5",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        # The random tiny model sometimes runs past max_tokens inside the JSON arguments,
        # and a cut-off call cannot be parsed; several seeded samples make a finished one
        # all but certain, and each finished one must be a parsed call.
        n=6,
        seed=7,
    )
    finished = [c for c in response.choices if c.finish_reason != "length"]
    assert finished, "every sample ran out of tokens"
    # The named choice makes vLLM emit exactly one call of that function. (vLLM's CPU build
    # does not constrain the arguments to the schema, so only their type is checked.)
    for choice in finished:
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 1
        assert calls[0].type == "function" and calls[0].function.name == "get_weather"
        assert isinstance(calls[0].function.arguments, str)


def test_auto_tool_choice_is_accepted(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="composer-2.5",
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="auto",
        max_tokens=8,
    )
    assert response.choices[0].finish_reason in {"stop", "length", "tool_calls"}


def test_response_format_json_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    response = client.chat.completions.create(
        model="composer-2.5",
        messages=MESSAGES,
        max_tokens=32,
        response_format={"type": "json_schema", "json_schema": {"name": "flag", "schema": schema}},
    )
    assert isinstance(response.choices[0].message.content, str)


def test_text_completions(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model="composer-2.5-standard", prompt="Once upon", max_tokens=4, logprobs=1, echo=False
    )
    assert isinstance(response, Completion)
    assert response.model == "composer-2.5-standard"
    assert response.choices[0].logprobs is not None
    chunks = list(
        client.completions.create(model="composer-2.5", prompt=[1, 2, 3], max_tokens=3, stream=True)
    )
    assert all(isinstance(chunk, Completion) and chunk.model == "composer-2.5" for chunk in chunks)


def test_errors_map_to_sdk_exceptions(client: openai.OpenAI, gateway: GatewayServer) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model="composer-2.5", messages=MESSAGES, max_tokens=10**6)
    assert too_many.value.param == "max_tokens"
    stranger = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-cs-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()


async def test_async_client_streams_and_completes(async_client: openai.AsyncOpenAI) -> None:
    response = await async_client.chat.completions.create(
        model="composer-2.5-standard", messages=MESSAGES, max_tokens=3
    )
    assert response.service_tier == "default"
    stream = await async_client.chat.completions.create(
        model="composer-2.5-fast",
        messages=MESSAGES,
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=RUN_TO_MAX_TOKENS,
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert {chunk.service_tier for chunk in chunks} == {"priority"}
    await async_client.close()
