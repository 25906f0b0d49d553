"""Admission reserves the worst case of every request shape, against the real vLLM: every
prompt of a text completion, every choice (``n``), every output token (``max_tokens``
capped by the tier and by the engine's context), and a prompt bound vLLM's count never
exceeds, tools included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from billing.contract import AdmissionRefused
from tests.support.gateway import GatewayServer, RecordingMeter

pytestmark = pytest.mark.vllm

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "f"},  # as short as a tool gets: the template's preamble dominates
}


@pytest.fixture(scope="module")
def shaped(
    start_gateway: Callable[..., GatewayServer], vllm_url: str
) -> tuple[GatewayServer, RecordingMeter]:
    meter = RecordingMeter()
    return start_gateway(meter=meter, upstream_url=vllm_url, max_prompts=4), meter


def post(gateway: GatewayServer, api_key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}{path}",
        json=body,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("Once upon a time", 1),
        (["Once upon", "a time", "there was"], 3),
        ([11, 12, 13, 14], 1),  # one prompt given as token ids
        ([[11, 12], [13], [14, 15, 16]], 3),  # one prompt per token-id list
    ],
    ids=["string", "strings", "token-ids", "token-id-lists"],
)
def test_every_prompt_and_choice_is_reserved(
    shaped: tuple[GatewayServer, RecordingMeter],
    api_key: str,
    prompt: str | list[Any],
    prompts: int,
) -> None:
    gateway, meter = shaped
    body = {"model": "composer-2.5", "prompt": prompt, "max_tokens": 5, "n": 2,
            "ignore_eos": True}  # fmt: skip
    response = post(gateway, api_key, "/v1/completions", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    request_id = response.headers["x-request-id"]
    # vLLM runs prompts x n sequences, each up to max_tokens: all of it was reserved.
    assert len(answer["choices"]) == prompts * 2
    (admitted,) = [a for a in meter.admitted if a.request_id == request_id]
    assert admitted.max_output_tokens == 5 * 2 * prompts
    assert answer["usage"]["completion_tokens"] == admitted.max_output_tokens
    assert answer["usage"]["prompt_tokens"] <= admitted.prompt_tokens
    (settled,) = [u for u in meter.wait_settled(len(meter.admitted)) if u.request_id == request_id]
    assert (settled.prompt_tokens, settled.completion_tokens) == (
        answer["usage"]["prompt_tokens"],
        answer["usage"]["completion_tokens"],
    )


def test_best_of_is_refused_before_admission(
    shaped: tuple[GatewayServer, RecordingMeter], api_key: str
) -> None:
    """``best_of`` above 1 (more sequences sampled than choices returned) would cost more
    than ``n`` reserves: it is refused (gateway.api.protocol), before anything is admitted."""
    gateway, meter = shaped
    body = {"model": "composer-2.5", "prompt": "a", "max_tokens": 3, "best_of": 4}
    response = post(gateway, api_key, "/v1/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "best_of"
    request_id = response.headers["x-request-id"]
    assert not [a for a in meter.admitted if a.request_id == request_id]


def test_an_unset_max_tokens_reserves_the_engines_context(
    shaped: tuple[GatewayServer, RecordingMeter], api_key: str, vllm_url: str
) -> None:
    """The tier allows 8192 output tokens, the engine's context is shorter: vLLM can never
    produce more than the context, so that is what is reserved per sequence."""
    gateway, meter = shaped
    context = httpx.get(f"{vllm_url}/v1/models").json()["data"][0]["max_model_len"]
    assert context < gateway.settings.fast_max_tokens
    chat = {"model": "composer-2.5", "messages": [{"role": "user", "content": "hi"}], "n": 2,
            "stop": ["a", "e", "o", " "]}  # fmt: skip
    response = post(gateway, api_key, "/v1/chat/completions", chat)
    assert response.status_code == 200, response.text
    (admitted,) = [a for a in meter.admitted if a.request_id == response.headers["x-request-id"]]
    assert admitted.max_output_tokens == context * 2


def test_a_tool_declaring_request_bounds_its_template(
    shaped: tuple[GatewayServer, RecordingMeter], api_key: str
) -> None:
    """A chat template adds a preamble for tools that a tiny body does not cover in
    bytes; the prompt bound still holds."""
    gateway, meter = shaped
    chat = {"model": "composer-2.5", "messages": [{"role": "user"}], "tools": [WEATHER_TOOL],
            "max_tokens": 1}  # fmt: skip
    response = post(gateway, api_key, "/v1/chat/completions", chat)
    assert response.status_code == 200, response.text
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    assert prompt_tokens > len(httpx.Request("POST", "/", json=chat).content)  # bytes alone fail
    (admitted,) = [a for a in meter.admitted if a.request_id == response.headers["x-request-id"]]
    assert prompt_tokens <= admitted.prompt_tokens


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        (["a"] * 5, "prompt"),  # more prompts than the gateway's max_prompts (4 here)
        ([[1]] * 5, "prompt"),
        ([], "prompt"),
        ([[]], "prompt"),
        (["a", 1], "prompt"),
    ],
    ids=["strings", "token-id-lists", "empty", "empty-ids", "mixed"],
)
def test_prompt_lists_beyond_the_cap_or_malformed_are_400(
    shaped: tuple[GatewayServer, RecordingMeter], api_key: str, prompt: list[Any], param: str
) -> None:
    gateway, meter = shaped
    admitted = len(meter.admitted)
    body = {"model": "composer-2.5", "prompt": prompt, "max_tokens": 1}
    response = post(gateway, api_key, "/v1/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert len(meter.admitted) == admitted  # refused before admission


def test_billing_unavailable_is_a_503_with_retry_after(
    start_gateway: Callable[..., GatewayServer], vllm_url: str, api_key: str
) -> None:
    refusal = AdmissionRefused(
        "billing is temporarily unavailable; retry shortly",
        code="billing_unavailable",
        retry_after_s=1,
        status_code=503,
    )
    gateway = start_gateway(meter=RecordingMeter(refuse=refusal), upstream_url=vllm_url)
    chat = {"model": "composer-2.5", "messages": [{"role": "user", "content": "hi"}]}
    response = post(gateway, api_key, "/v1/chat/completions", chat)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"] == {
        "message": "billing is temporarily unavailable; retry shortly",
        "type": "server_error",
        "param": None,
        "code": "billing_unavailable",
    }
