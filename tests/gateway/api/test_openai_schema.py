"""Every answer the gateway serves validates against OpenAI's published response schema
(``openai_response_schema.json``, re-expressed from openai/openai-openapi: see its
``$comment``), as the real vLLM answers through it: chat and text completions, whole and
streamed chunk by chunk (with and without usage), several choices, logprobs, tool calls,
``/v1/models`` and error bodies. ``service_tier`` is in OpenAI's values; our tier name is
in the ``x-cstack-tier`` header.

Known gap, the same in OpenAI's own API: a text completion with ``echo`` and ``logprobs``
has null logprobs for the prompt's first token, which the schema's arrays do not allow.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from billing.contract import UsageReport
from billing.meter.events import answer_cost
from billing.prices.pricing import load_pricebook
from billing.settings import DEFAULT_PRICEBOOK_PATH
from gateway.api.stream import StreamRewriter, error_event
from serving.vocabulary import ANSWER_SERVICE_TIERS, DEFAULT_TIER, SERVICE_TIERS, Tier
from tests.support.gateway import WEATHER_TOOL, GatewayServer, RecordingMeter

pytestmark = pytest.mark.vllm

BOOK = load_pricebook(DEFAULT_PRICEBOOK_PATH)
SCHEMA: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "openai_response_schema.json").read_text()
)
CHAT: dict[str, Any] = {
    "model": "composer-2.5",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 4,
}
COMPLETION: dict[str, Any] = {"model": "composer-2.5", "prompt": "Once upon", "max_tokens": 4}
CHAT_CASES: dict[str, dict[str, Any]] = {
    "plain": CHAT,
    "n=2": {**CHAT, "n": 2, "seed": 3, "temperature": 1.0},
    "logprobs": {**CHAT, "logprobs": True, "top_logprobs": 2},
    # A named tool choice makes vLLM call it (guided decoding), even with the tiny model.
    "tools": {**CHAT, "max_tokens": 48, "tools": [WEATHER_TOOL],
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    # Reasoning (reasoning_content, usage's reasoning_tokens) next to the answer.
    "reasoning": {**CHAT, "max_tokens": 80, "seed": 1, "temperature": 1.0,
                  "reasoning_effort": "minimal", "verbosity": "low"},
}  # fmt: skip
COMPLETION_CASES: dict[str, dict[str, Any]] = {
    "plain": COMPLETION,
    "prompts-n=2-logprobs": {**COMPLETION, "prompt": ["a b", "c"], "n": 2, "seed": 1,
                             "temperature": 1.0, "logprobs": 2},
}  # fmt: skip
#: How the answer is asked for: one JSON answer, a bare stream, a stream with usage in
#: every chunk (vLLM's ``continuous_usage_stats``) and in a final usage chunk.
MODES: dict[str, dict[str, Any]] = {
    "answer": {},
    "stream": {"stream": True},
    "stream-usage": {
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    },
}


@functools.cache
def validator(definition: str) -> Draft202012Validator:
    schema = {"$ref": f"#/$defs/{definition}", "$defs": SCHEMA["$defs"]}
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def assert_conforms(definition: str, instance: object) -> None:
    errors = sorted(validator(definition).iter_errors(instance), key=lambda e: list(e.path))
    where = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
    assert not where, f"not a valid {definition}:\n" + "\n".join(where)


def post(gateway: GatewayServer, api_key: str, path: str, body: object) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}{path}",
        json=body,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=120,
    )


def stream_chunks(
    gateway: GatewayServer, api_key: str, path: str, body: dict[str, Any]
) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    """The response headers and every chunk of a stream, which must end in ``[DONE]``."""
    with httpx.stream(
        "POST",
        f"{gateway.url}{path}",
        json=body,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=120,
    ) as response:
        assert response.status_code == 200, response.read()
        data = [line[5:].strip() for line in response.iter_lines() if line.startswith("data:")]
    assert data and data[-1] == "[DONE]", data[-1:]
    return response.headers, [json.loads(event) for event in data[:-1]]


def served(
    gateway: GatewayServer, api_key: str, path: str, body: dict[str, Any], definition: str
) -> list[dict[str, Any]]:
    """The answer (or every chunk of the stream), each checked against ``definition``."""
    if body.get("stream"):
        headers, answers = stream_chunks(gateway, api_key, path, body)
    else:
        response = post(gateway, api_key, path, body)
        assert response.status_code == 200, response.text
        headers, answers = response.headers, [response.json()]
    for answer in answers:
        assert_conforms(definition, answer)
    assert {answer["service_tier"] for answer in answers} == {"priority"}
    assert headers["x-cstack-tier"] == "fast"
    return answers


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CHAT_CASES)
def test_chat_completions_conform(
    gateway: GatewayServer, api_key: str, case: str, mode: str
) -> None:
    body = {**CHAT_CASES[case], **MODES[mode]}
    streamed = bool(body.get("stream"))
    definition = (
        "CreateChatCompletionStreamResponse" if streamed else "CreateChatCompletionResponse"
    )
    answers = served(gateway, api_key, "/v1/chat/completions", body, definition)
    choices = [choice for answer in answers for choice in answer["choices"]]
    # The cases reach the parts of the schema they are about.
    assert {choice["index"] for choice in choices} == set(range(body.get("n", 1)))
    if body.get("logprobs"):
        assert any(choice["logprobs"] for choice in choices)
    if body.get("tools"):
        parts = [choice["delta"] if streamed else choice["message"] for choice in choices]
        assert any(part.get("tool_calls") for part in parts)
    if body.get("reasoning_effort"):
        parts = [choice["delta"] if streamed else choice["message"] for choice in choices]
        assert any(part.get("reasoning_content") for part in parts)
    if mode == "stream-usage":
        assert all(answer["usage"] for answer in answers)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", COMPLETION_CASES)
def test_text_completions_conform(
    gateway: GatewayServer, api_key: str, case: str, mode: str
) -> None:
    body = {**COMPLETION_CASES[case], **MODES[mode]}
    definition = "CreateCompletionStreamChunk" if body.get("stream") else "CreateCompletionResponse"
    answers = served(gateway, api_key, "/v1/completions", body, definition)
    if body.get("logprobs"):
        assert any(choice["logprobs"] for answer in answers for choice in answer["choices"])


class PricingMeter(RecordingMeter):
    """Admits and records as ``RecordingMeter``, and prices each answer as billing does
    (``usage.cstack_cost``: the extension field every metered answer carries)."""

    def usage_cost(self, usage: UsageReport) -> dict[str, Any] | None:
        return answer_cost(BOOK, usage)


@pytest.fixture(scope="module")
def priced_gateway(start_gateway: Callable[..., GatewayServer], vllm_url: str) -> GatewayServer:
    return start_gateway(meter=PricingMeter(), upstream_url=vllm_url)


@pytest.mark.parametrize("mode", ["answer", "stream-usage"])
@pytest.mark.parametrize(
    ("path", "body", "definitions"),
    [
        (
            "/v1/chat/completions",
            CHAT_CASES["n=2"],
            ("CreateChatCompletionResponse", "CreateChatCompletionStreamResponse"),
        ),
        (
            "/v1/completions",
            COMPLETION_CASES["prompts-n=2-logprobs"],
            ("CreateCompletionResponse", "CreateCompletionStreamChunk"),
        ),
    ],
    ids=["chat", "completions"],
)
def test_answers_carrying_their_cost_conform(
    priced_gateway: GatewayServer,
    api_key: str,
    path: str,
    body: dict[str, Any],
    definitions: tuple[str, str],
    mode: str,
) -> None:
    definition = definitions[mode != "answer"]
    answers = served(priced_gateway, api_key, path, {**body, **MODES[mode]}, definition)
    usage = answers[-1]["usage"]
    cost = usage["cstack_cost"]
    prices = BOOK.version_at(datetime.now(UTC)).tiers["fast"]
    assert cost["list_cost_nano_usd"] == (
        usage["prompt_tokens"] * prices.input + usage["completion_tokens"] * prices.output
    )
    # Only the final usage carries it (a stream with continuous usage has it in every chunk).
    assert not any("cstack_cost" in (answer.get("usage") or {}) for answer in answers[:-1])


def test_models_list_conforms(gateway: GatewayServer, api_key: str) -> None:
    response = httpx.get(
        f"{gateway.url}/v1/models", headers={"authorization": f"Bearer {api_key}"}, timeout=30
    )
    assert response.status_code == 200
    assert_conforms("ListModelsResponse", response.json())


@pytest.mark.parametrize(
    ("path", "body", "key", "status"),
    [
        ("/v1/chat/completions", {**CHAT, "temperature": 9}, None, 400),
        ("/v1/chat/completions", [1, 2], None, 400),
        ("/v1/completions", {**COMPLETION, "service_tier": "turbo"}, None, 400),
        ("/v1/chat/completions", CHAT, "sk-cs-not-a-key", 401),
        ("/v1/chat/completions", {**CHAT, "model": "composer-9"}, None, 404),
        ("/v1/no-such-route", CHAT, None, 404),
    ],
    ids=["bad-parameter", "not-an-object", "bad-service-tier", "bad-key", "no-model", "no-route"],
)
def test_error_bodies_conform(
    gateway: GatewayServer, api_key: str, path: str, body: object, key: str | None, status: int
) -> None:
    response = post(gateway, key or api_key, path, body)
    assert response.status_code == status, response.text
    assert_conforms("ErrorResponse", response.json())


def test_in_stream_errors_conform() -> None:
    """The gateway's own error events, and vLLM's relayed (a stream that fails once
    started): vLLM writes its HTTP status as the ``code``, a number."""
    rewriter = StreamRewriter("composer-2.5", "fast", include_usage=False, continuous_usage=False)
    vllm_error = {"message": "Internal server error", "type": "InternalServerError",
                  "param": None, "code": 500}  # fmt: skip
    (relayed,) = rewriter.feed(b"data: " + json.dumps({"error": vllm_error}).encode() + b"\n\n")
    own = error_event("upstream failed mid-stream", "upstream_stream_cut")
    for event in (relayed, own):
        assert event.startswith(b"data: ") and event.endswith(b"\n\n")
        assert_conforms("ErrorResponse", json.loads(event[6:]))
    assert rewriter.failed


def test_an_admitted_requests_error_conforms_and_names_its_tier(
    gateway: GatewayServer, api_key: str
) -> None:
    """vLLM refuses a prompt longer than its context only once the gateway has admitted
    the request: its error is relayed in OpenAI's shape, with the tier that was routed."""
    response = post(gateway, api_key, "/v1/completions", {**COMPLETION, "prompt": [11] * 4096})
    assert response.status_code == 400, response.text
    assert_conforms("ErrorResponse", response.json())
    assert response.headers["x-cstack-tier"] == "fast"


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
@pytest.mark.parametrize("requested", [*SERVICE_TIERS, None])
def test_service_tier_is_openais_and_the_header_names_ours(
    gateway: GatewayServer, api_key: str, requested: str | None, stream: bool
) -> None:
    """Every ``service_tier`` a request may name is accepted; the answer says OpenAI's
    name of the tier that served it (fast: priority, standard: default), the header ours."""
    tier = (SERVICE_TIERS[requested] if requested else None) or DEFAULT_TIER
    body = {**CHAT, "max_tokens": 1, "stream": stream}
    if requested:
        body["service_tier"] = requested
    if stream:
        headers, answers = stream_chunks(gateway, api_key, "/v1/chat/completions", body)
    else:
        response = post(gateway, api_key, "/v1/chat/completions", body)
        assert response.status_code == 200, response.text
        headers, answers = response.headers, [response.json()]
    definition = "CreateChatCompletion" + ("StreamResponse" if stream else "Response")
    for answer in answers:
        assert_conforms(definition, answer)
    assert {answer["service_tier"] for answer in answers} == {ANSWER_SERVICE_TIERS[tier]}
    assert headers["x-cstack-tier"] == tier


@pytest.mark.parametrize(("model", "tier"), [("composer-2.5-standard", "standard"),
                                             ("composer-2.5-fast", "fast")])  # fmt: skip
def test_a_suffixed_model_reports_its_tier(
    gateway: GatewayServer, api_key: str, model: str, tier: Tier
) -> None:
    response = post(gateway, api_key, "/v1/completions", {**COMPLETION, "model": model})
    assert response.status_code == 200, response.text
    assert_conforms("CreateCompletionResponse", response.json())
    assert response.json()["service_tier"] == ANSWER_SERVICE_TIERS[tier]
    assert response.headers["x-cstack-tier"] == tier
