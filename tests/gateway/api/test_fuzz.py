"""Property test of request validation: whatever a client sends, never a 5xx.

Hypothesis mutates well-formed chat and text completion requests (wrong types, out-of-range
numbers, unknown fields, missing fields, odd nesting) and also sends arbitrary bytes. The
gateway runs in front of the real vLLM with tiny output caps, so requests that pass
validation really are served, and upstream answers are part of the property too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway import GatewayServer

pytestmark = pytest.mark.vllm

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
ANY_JSON = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
CHAT_FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
    "stream", "stream_options", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
    "seed", "service_tier", "response_format", "logprobs", "top_logprobs", "tools",
    "tool_choice", "top_k", "min_p", "ignore_eos", "min_tokens", "priority", "chat_template",
]  # fmt: skip
MESSAGE_VALUES = st.sampled_from(
    [
        [{"role": "user", "content": "hi"}],
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f"}}]}],
        [{"role": "tool", "content": "42", "tool_call_id": "1"}],
        [],
    ]
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["composer-2.5", "composer-2.5-fast", "composer-2.5-standard", ""]),
    "messages": MESSAGE_VALUES,
    "max_tokens": st.integers(min_value=-2, max_value=4),
    "n": st.integers(min_value=-1, max_value=3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries(
        {"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    ),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(min_value=-1, max_value=25),
    "tool_choice": st.sampled_from(
        ["auto", "none", "required", {"type": "function", "function": {"name": "f"}}]
    ),
    "tools": st.just(
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    ),
    "response_format": st.sampled_from(
        [{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}]
    ),
}


@st.composite
def chat_requests(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "composer-2.5",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    for field in draw(st.lists(st.sampled_from(CHAT_FIELDS), max_size=4, unique=True)):
        strategy = FIELD_VALUES.get(field, ANY_JSON)
        body[field] = draw(strategy | ANY_JSON) if draw(st.booleans()) else draw(strategy)
    for field in draw(st.lists(st.sampled_from(sorted(body)), max_size=1)):
        del body[field]
    return body


@st.composite
def completion_requests(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(chat_requests())
    body.pop("messages", None)
    body["prompt"] = draw(
        st.sampled_from(["hi", ["a", "b"], [1, 2, 3], [[1, 2]], [], [-1], [2**40]]) | ANY_JSON
    )
    return body


@pytest.fixture(scope="module")
def http(start_gateway: Callable[..., GatewayServer], vllm_url: str, api_key: str) -> httpx.Client:
    gateway = start_gateway(
        upstream_url=vllm_url, fast_max_tokens=3, standard_max_tokens=3, max_n=2
    )
    return httpx.Client(
        base_url=gateway.url, headers={"authorization": f"Bearer {api_key}"}, timeout=60
    )


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(body=chat_requests())
def test_chat_never_5xx(http: httpx.Client, body: dict[str, Any]) -> None:
    check(http.post("/v1/chat/completions", json=body))


@FUZZ
@given(body=completion_requests())
def test_completions_never_5xx(http: httpx.Client, body: dict[str, Any]) -> None:
    check(http.post("/v1/completions", json=body))


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_5xx(http: httpx.Client, raw: bytes) -> None:
    check(http.post("/v1/chat/completions", content=raw))
