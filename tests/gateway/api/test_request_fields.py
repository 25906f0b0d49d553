"""The written policy for request fields (gateway/api/protocol.py, docs/api.md "Request fields"):
every OpenAI parameter is passed to vLLM, applied, ignored or refused, and any other field
is a 400 naming it. The live tests go through the real ``openai`` SDK to a real gateway and vLLM;
the others check the policy against the installed SDK's own parameter lists, so that a
parameter a newer SDK adds fails here instead of meeting an unplanned 400."""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.shared.reasoning_effort import ReasoningEffort as SdkReasoningEffort

from gateway.api.handler import GenerationHandler
from gateway.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    Policy,
    SamplingParams,
    field_policy,
    parse_request,
)
from gateway.errors import GatewayError
from gateway.settings import GatewaySettings
from gateway.upstream.tiers import TierRoute
from serving.settings import ServingSettings
from serving.variants import load_variants
from serving.vocabulary import REASONING_EFFORTS, ReasoningEffort
from tests.support.gateway import GatewayServer, RecordingMeter

README = Path(__file__).resolve().parents[3] / "docs" / "api.md"
MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]
#: vLLM's sampling extensions the gateway passes on (RL rollouts use them): the only
#: fields outside OpenAI's parameters, so that adding one is a decision made here too.
VLLM_EXTENSIONS = {
    "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "return_token_ids",
}  # fmt: skip
ENDPOINTS: list[tuple[type[SamplingParams], Any]] = [
    (ChatCompletionRequest, chat_params),
    (CompletionRequest, completion_params),
]


def sdk_parameters(module: Any) -> set[str]:
    """Every parameter the SDK's ``create`` sends (``stream`` is only in the two subtypes)."""
    return {
        name
        for typed_dict in ("CompletionCreateParamsStreaming", "CompletionCreateParamsNonStreaming")
        for name in getattr(module, typed_dict).__annotations__
    }


# --- The policy against the installed SDK and docs/api.md -------------------------------


@pytest.mark.parametrize(("model", "sdk"), ENDPOINTS, ids=["chat", "completions"])
def test_every_sdk_parameter_has_a_policy(model: type[SamplingParams], sdk: Any) -> None:
    policy = field_policy(model)
    assert sdk_parameters(sdk) - set(policy) == set(), "new SDK parameters: decide their policy"
    # Ignoring or refusing is only ever decided for OpenAI's parameters; beyond them only
    # vLLM's sampling extensions are accepted, and passed on.
    beyond = {name: kind for name, kind in policy.items() if name not in sdk_parameters(sdk)}
    assert set(beyond) <= VLLM_EXTENSIONS | {"response_format", "service_tier"}
    assert set(beyond.values()) == {Policy.PASSED}


def test_reasoning_effort_takes_openais_values() -> None:
    (sdk_values,) = [arg for arg in typing.get_args(SdkReasoningEffort) if arg is not type(None)]
    assert set(typing.get_args(ReasoningEffort)) == set(typing.get_args(sdk_values))
    # The variants file's budgets are checked against the same values.
    assert set(REASONING_EFFORTS) == set(typing.get_args(ReasoningEffort))


def test_the_readme_lists_every_field_under_its_policy() -> None:
    section = README.read_text().split("## Request fields", 1)[1].split("\n## ", 1)[0]
    bullets = {
        match[1].lower(): set(re.findall(r"`([a-z_]+)`", match[2]))
        for match in re.finditer(r"^- \*\*(\w+)\*\*(.*?)(?=^\S|^- |\Z)", section, re.M | re.S)
    }
    for model, _ in ENDPOINTS:
        for name, kind in field_policy(model).items():
            assert name in bullets[kind.value], f"README: {name} is not listed as {kind.value}"


# --- What reaches vLLM -------------------------------------------------------------------


def upstream_body(
    model: type[SamplingParams],
    body: dict[str, Any],
    thinking_budgets: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The body the gateway would send vLLM for ``body`` (GenerationHandler.shape)."""
    handler = GenerationHandler(
        settings=GatewaySettings(),
        auth=None,  # type: ignore[arg-type]
        router=None,  # type: ignore[arg-type]
        meter=None,  # type: ignore[arg-type]
        relay=SimpleNamespace(max_model_len=lambda tier: None),  # type: ignore[arg-type]
    )
    route = TierRoute(
        "fast", "composer-2.5", "composer-2.5", priority=None, max_tokens=8,
        thinking_budgets=thinking_budgets or {},
    )  # fmt: skip
    raw = json.dumps(body).encode()
    shape = handler.shape(parse_request(model, raw), route, len(raw))
    sent: dict[str, Any] = json.loads(shape.upstream_body)
    return sent


def test_only_passed_fields_reach_vllm() -> None:
    ignored = {
        "user": "u-1", "store": True, "metadata": {"team": "rl"}, "safety_identifier": "h",
        "prompt_cache_key": "k", "prompt_cache_retention": "24h",
        "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    }  # fmt: skip
    nothing_asked = {"modalities": ["text"], "audio": None, "functions": None}
    body = {"model": "composer-2.5", "messages": MESSAGES, "top_k": 5, "return_token_ids": True}
    sent = upstream_body(ChatCompletionRequest, {**body, **ignored, **nothing_asked})
    # chat_template_kwargs: every chat says whether it thinks (see the next test);
    # stream_interval: an answer assembled whole is read in chunks of several tokens.
    added = {"max_tokens", "stream", "stream_options", "chat_template_kwargs", "stream_interval"}
    assert set(sent) == {*body, *added}
    completion = {"model": "composer-2.5", "prompt": "a", "user": "u-1", "best_of": 1}
    assert "user" not in upstream_body(CompletionRequest, completion)
    assert "best_of" not in upstream_body(CompletionRequest, completion)


BUDGETS = {"minimal": 64, "low": 256, "medium": 1024, "high": 4096}


@pytest.mark.parametrize(
    ("applied", "kwargs", "budget"),
    [
        # Sent even when off: Kimi K2.5's template thinks unless told not to.
        ({}, {"thinking": False}, None),
        ({"reasoning_effort": "none"}, {"thinking": False}, None),
        ({"reasoning_effort": "low"}, {"thinking": True}, 256),
        ({"reasoning_effort": "high", "verbosity": "low"},
         {"thinking": True, "verbosity": "low"}, 4096),
        # An effort the variants file gives no budget does not think.
        ({"reasoning_effort": "max"}, {"thinking": False}, None),
        ({"verbosity": "high"}, {"thinking": False, "verbosity": "high"}, None),
    ],
)  # fmt: skip
def test_applied_fields_reach_vllm_as_template_kwargs_and_a_budget(
    applied: dict[str, Any], kwargs: dict[str, Any], budget: int | None
) -> None:
    body = {"model": "composer-2.5", "messages": MESSAGES, **applied}
    sent = upstream_body(ChatCompletionRequest, body, thinking_budgets=BUDGETS)
    assert "reasoning_effort" not in sent and "verbosity" not in sent
    assert sent["chat_template_kwargs"] == kwargs
    assert sent.get("thinking_token_budget") == budget


def test_the_variants_file_budgets_every_effort_but_none() -> None:
    budgets = load_variants(ServingSettings().variants_file).thinking_budgets
    assert set(budgets) == set(typing.get_args(ReasoningEffort)) - {"none"}
    # A higher effort never thinks less.
    ordered = [budgets[e] for e in ("minimal", "low", "medium", "high", "xhigh", "max")]
    assert ordered == sorted(ordered)


def refusal(model: type[SamplingParams], body: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(GatewayError) as refused:
        parse_request(model, json.dumps(body).encode())
    assert refused.value.status_code == 400
    return refused.value.body()["error"]


def test_a_refused_field_is_named_before_the_errors_it_explains() -> None:
    """A legacy client's ``functions`` comes with ``role: function`` messages: the error
    names what to change, ``functions``, not the message role it implies."""
    legacy = {
        "model": "composer-2.5",
        "messages": [{"role": "function", "name": "f", "content": "42"}],
        "functions": [{"name": "f", "parameters": {}}],
    }
    error = refusal(ChatCompletionRequest, legacy)
    assert (error["param"], error["code"]) == ("functions", "unsupported_parameter")
    assert "tools" in error["message"]


def test_an_unknown_field_name_is_capped_in_the_error() -> None:
    error = refusal(CompletionRequest, {"model": "composer-2.5", "prompt": "a", "x" * 5000: 1})
    assert error["code"] == "unknown_parameter"
    assert len(error["param"]) == 200 and len(error["message"]) < 300


# --- Through the openai SDK, the real gateway and vLLM -----------------------------------


def chat(client: openai.OpenAI, **params: Any) -> Any:
    return client.chat.completions.create(
        model="composer-2.5", messages=MESSAGES, max_tokens=2, **params
    )


def complete(client: openai.OpenAI, **params: Any) -> Any:
    return client.completions.create(model="composer-2.5", prompt="Once", max_tokens=2, **params)


def bad_request(
    call: Callable[..., Any], client: openai.OpenAI, meter: RecordingMeter, **params: Any
) -> dict[str, Any]:
    """The error body of the 400 ``call`` gets, with nothing admitted (so nothing was sent
    to vLLM: admission comes before the relay)."""
    with pytest.raises(openai.BadRequestError) as refused:
        call(client, **params)
    error = refused.value
    assert error.status_code == 400
    assert isinstance(error.body, dict)
    assert set(error.body) == {"message", "type", "param", "code"}
    assert (error.type, error.param, error.code) == (
        "invalid_request_error", error.body["param"], error.body["code"],
    )  # fmt: skip
    request_id = error.response.headers["x-request-id"]
    assert not [a for a in meter.admitted if a.request_id == request_id]
    return error.body


@pytest.mark.vllm
def test_ignored_fields_are_accepted(client: openai.OpenAI) -> None:
    answer = chat(
        client,
        store=False,
        metadata={"team": "rl", "run": "42"},
        user="user-1",
        safety_identifier="5f1c0a",
        prompt_cache_key="repo-7",
        prompt_cache_retention="24h",
        prompt_cache_options={"mode": "implicit", "ttl": "30m"},
        # Refused fields that ask for nothing: text output, and None sent as null.
        modalities=["text"],
        audio=None,
        prediction=None,
    )
    assert answer.choices[0].message.role == "assistant"
    assert complete(client, user="user-1", best_of=1).choices


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("call", "params", "param"),
    [
        (chat, {"modalities": ["text", "audio"]}, "modalities"),
        (chat, {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        (chat, {"prediction": {"type": "content", "content": "Hello"}}, "prediction"),
        (chat, {"web_search_options": {}}, "web_search_options"),
        (chat, {"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        (chat, {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        (chat, {"function_call": "auto"}, "function_call"),
        (complete, {"best_of": 2}, "best_of"),
        (complete, {"suffix": " world"}, "suffix"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_refused_fields_are_a_400_naming_them(
    client: openai.OpenAI,
    recorded: tuple[GatewayServer, RecordingMeter],
    call: Callable[..., Any],
    params: dict[str, Any],
    param: str,
) -> None:
    error = bad_request(call, client, recorded[1], **params)
    assert (error["param"], error["code"]) == (param, "unsupported_parameter")
    assert error["message"].startswith(f"{param} is not supported: ")


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("call", "extra"),
    [
        (chat, {"frobnicate": 1}),
        (chat, {"max_token": 4}),  # misspelt: OpenAI refuses it too
        # vLLM's own knobs, which would let one tenant jump the queue or change the template.
        (chat, {"priority": -100}),
        (chat, {"chat_template": "{{ messages[0].content }}"}),
        (chat, {"chat_template_kwargs": {"enable_thinking": True}}),
        (chat, {"kv_transfer_params": {"do_remote_prefill": True}}),
        (complete, {"priority": -100}),
        (complete, {"store": True}),  # a chat-only field
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_unknown_fields_are_a_400_naming_them(
    client: openai.OpenAI,
    recorded: tuple[GatewayServer, RecordingMeter],
    call: Callable[..., Any],
    extra: dict[str, Any],
) -> None:
    (name,) = extra
    error = bad_request(call, client, recorded[1], extra_body=extra)
    assert (error["param"], error["code"]) == (name, "unknown_parameter")
    assert error["message"] == f"Unrecognized request argument supplied: {name}"


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("params", "param"),
    [({"reasoning_effort": "bogus"}, "reasoning_effort"), ({"verbosity": "loud"}, "verbosity")],
)
def test_applied_fields_are_validated(
    client: openai.OpenAI,
    recorded: tuple[GatewayServer, RecordingMeter],
    params: dict[str, Any],
    param: str,
) -> None:
    error = bad_request(chat, client, recorded[1], **params)
    assert (error["param"], error["code"]) == (param, "invalid_value")


@pytest.mark.vllm
def test_vllm_sampling_extensions_still_reach_vllm(client: openai.OpenAI) -> None:
    """What this repo's own callers send (training/rl/agent/client.py, bench/, tests)."""
    answer = chat(
        client,
        seed=7,
        service_tier="standard",
        extra_body={
            "return_token_ids": True, "ignore_eos": True, "top_k": 5, "min_p": 0.0,
            "repetition_penalty": 1.0, "min_tokens": 2,
        },
    )  # fmt: skip
    assert answer.usage.completion_tokens == 2  # ignore_eos and min_tokens applied
    assert answer.model_extra["prompt_token_ids"]  # return_token_ids applied
