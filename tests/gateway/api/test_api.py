"""The HTTP surface: request ids, bad input, hidden vLLM endpoints, billing hooks, metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest

from billing.contract import AdmissionRefused
from tests.support.gateway import GatewayServer, RecordingMeter, metric_value

pytestmark = pytest.mark.vllm

CHAT = {"model": "composer-2.5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def metered(
    start_gateway: Callable[..., GatewayServer], vllm_url: str
) -> tuple[GatewayServer, RecordingMeter]:
    meter = RecordingMeter()
    return start_gateway(meter=meter, upstream_url=vllm_url, max_messages=4, max_n=2), meter


@pytest.fixture(scope="module")
def http(metered: tuple[GatewayServer, RecordingMeter], api_key: str) -> httpx.Client:
    return httpx.Client(
        base_url=metered[0].url, headers={"authorization": f"Bearer {api_key}"}, timeout=60
    )


def error_of(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_request_ids_are_kept_or_made(http: httpx.Client) -> None:
    own = http.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "trace-42"})
    assert own.status_code == 200 and own.headers["x-request-id"] == "trace-42"
    for response in (
        http.post("/v1/chat/completions", json=CHAT),
        http.get("/nowhere"),
        httpx.get(f"{str(http.base_url).rstrip('/')}/v1/models"),
    ):
        assert response.headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"model": "composer-2.5"}', 400, "messages"),
        (b'{"model": "composer-2.5", "messages": "hi"}', 400, "messages"),
        (b'{"model": "composer-2.5", "messages": [{"role": "robot", "content": "x"}]}', 400,
         "messages[0].role"),
        (b'{"model": "composer-2.5", "messages": [{"role": "user", "content": "x"}], '
         b'"temperature": 9}', 400, "temperature"),
        (b'{"model": "composer-2.5", "messages": [{"role": "user", "content": "x"}], "n": 3}',
         400, "n"),
        (b'{"model": "composer-2.5", "messages": [{"role": "user", "content": "x"}], '
         b'"max_completion_tokens": 99999999}', 400, "max_completion_tokens"),
        (b'{"model": "composer-2.5", "messages": [{"role": "user", "content": "x"}], '
         b'"stream_options": {"include_usage": true}}', 400, "stream_options"),
        (b'{"model": "composer-2.5", "messages": [{"role": "user", "content": "x"}], '
         b'"service_tier": "turbo"}', 400, "service_tier"),
        (b'{"model": "composer-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ],
)  # fmt: skip
def test_bad_input_is_a_4xx_naming_the_parameter(
    http: httpx.Client, body: bytes, status: int, param: str | None
) -> None:
    response = http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    assert error_of(response)["param"] == param


def test_caps_on_body_size_and_message_count(http: httpx.Client) -> None:
    too_many = {**CHAT, "messages": [{"role": "user", "content": "x"}] * 5}
    response = http.post("/v1/chat/completions", json=too_many)
    assert response.status_code == 400 and error_of(response)["param"] == "messages"
    huge = b'{"model": "composer-2.5", "prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    response = http.post("/v1/completions", content=huge)
    assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"


def test_a_body_sent_in_pieces_without_a_length_is_read_whole_and_capped(
    http: httpx.Client,
) -> None:
    """Chunked uploads carry no content-length: the body is read piece by piece, and the
    cap holds on what arrives."""
    body = json.dumps(CHAT).encode()
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
    response = http.post("/v1/chat/completions", content=iter(pieces))
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "chat.completion"
    huge = (b'{"model": "composer-2.5", "prompt": "', *[b"x" * 65536] * 80, b'"}')
    response = http.post("/v1/completions", content=iter(huge))
    assert response.status_code == 413 and error_of(response)["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/sleep"),
        ("POST", "/collective_rpc"),
        ("POST", "/tokenize"),
        ("GET", "/v1/chat/completions"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("POST", "/v1/embeddings"),
    ],
)
def test_vllm_admin_and_dev_endpoints_do_not_exist(
    http: httpx.Client, method: str, path: str
) -> None:
    response = http.request(method, path)
    assert response.status_code in (404, 405)
    error_of(response)


def test_missing_or_malformed_key_is_401(metered: tuple[GatewayServer, RecordingMeter]) -> None:
    url = f"{metered[0].url}/v1/chat/completions"
    for headers in ({}, {"authorization": "Basic abc"}, {"authorization": "Bearer sk-cs-x.y"}):
        response = httpx.post(url, json=CHAT, headers=headers)
        assert response.status_code == 401
        assert error_of(response)["code"] == "invalid_api_key"


def test_usage_is_settled_once_with_vllms_counts(
    http: httpx.Client, metered: tuple[GatewayServer, RecordingMeter]
) -> None:
    gateway, meter = metered
    before = len(meter.settled)
    plain = http.post("/v1/chat/completions", json={**CHAT, "model": "composer-2.5-standard"})
    assert plain.headers["x-ratelimit-remaining-requests"] == "99"
    usage = plain.json()["usage"]
    with http.stream(
        "POST",
        "/v1/completions",
        json={"model": "composer-2.5", "prompt": "a", "max_tokens": 4, "stream": True},
    ) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and all('"usage"' not in e for e in events)
    settled = meter.wait_settled(before + 2)[before:]
    assert [(u.outcome, u.tier) for u in settled] == [
        ("complete", "standard"),
        ("complete", "fast"),
    ]
    assert settled[0].prompt_tokens == usage["prompt_tokens"]
    assert settled[0].completion_tokens == usage["completion_tokens"] == 3
    finish = [
        choice["finish_reason"]
        for event in events[:-1]
        for choice in json.loads(event.removeprefix("data: "))["choices"]
        if choice.get("finish_reason")
    ]
    # max_tokens reached: exactly 4. The tiny random model may also end its text sooner
    # (CI saw 3): then vLLM's count, never more than max_tokens.
    if finish == ["length"]:
        assert settled[1].completion_tokens == 4
    else:
        assert finish == ["stop"] and 0 < settled[1].completion_tokens <= 4
    assert settled[1].prompt_tokens > 0
    admitted = {a.request_id: a for a in meter.admitted}
    assert admitted[settled[0].request_id].max_output_tokens == 3
    assert admitted[settled[1].request_id].prompt_tokens > 0
    metrics = httpx.get(f"{gateway.internal_url}/metrics").text
    assert (
        metric_value(metrics, "cstack_requests_total", tier="standard", route="chat", status="200")
        >= 1
    )
    assert metric_value(metrics, "cstack_tokens_total", tier="fast", direction="output") >= 4
    assert metric_value(metrics, "cstack_time_to_first_token_seconds_count", tier="fast") >= 1


def test_admission_refusal_is_a_429_with_retry_after(
    start_gateway: Callable[..., GatewayServer], vllm_url: str, api_key: str
) -> None:
    refusal = AdmissionRefused(
        "Rate limit reached for requests",
        code="rate_limit_exceeded",
        retry_after_s=7,
        headers={"x-ratelimit-remaining-requests": "0"},
    )
    gateway = start_gateway(meter=RecordingMeter(refuse=refusal), upstream_url=vllm_url)
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {api_key}"},
    )
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert error_of(response)["code"] == "rate_limit_exceeded"


def test_usage_endpoint_and_probes(http: httpx.Client) -> None:
    usage = http.get("/v1/usage", params={"start": "2026-01-01", "end": "2026-12-31"})
    assert usage.status_code == 200 and usage.json()["org_id"] == "acme"
    bad = http.get("/v1/usage", params={"start": "yesterday"})
    assert bad.status_code == 400 and error_of(bad)["param"] == "start"
    grouping = http.get("/v1/usage", params={"group_by": "key"})
    assert grouping.status_code == 400 and error_of(grouping)["param"] == "group_by"
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_connections_idle_past_vllms_keep_alive_are_not_reused(http: httpx.Client) -> None:
    """vLLM's server drops idle keep-alive connections after 5 s; the next request must not
    land on one of those (it would fail on a single-replica pool)."""
    assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    time.sleep(5.5)
    assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
