"""Tokens generated before a request ends early are billed, against the real vLLM: a client
that hangs up on a non-streaming request, a stream of several choices cut short, and a
request ended at the gateway's maximum duration (streaming or not, chat or responses)."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.support.fakes.replica import Forwarder
from tests.support.gateway import GatewayServer, RecordingMeter, metric_value
from tests.support.waits import wait_until

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Tell a long story."}]
#: The gateway's maximum request duration in the test of it.
MAX_DURATION_S = 8
ENDLESS = {"model": "composer-2.5", "messages": MESSAGES, "max_tokens": 1500, "ignore_eos": True}


def vllm_metric(vllm_url: str, name: str) -> float:
    return metric_value(httpx.get(f"{vllm_url}/metrics").text, name)


def test_a_client_hanging_up_on_a_non_streaming_request_pays_what_was_generated(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    vllm_url: str,
    api_key: str,
) -> None:
    """The client has received nothing when it hangs up; vLLM had generated tokens for it.
    (The forwarder in front of vLLM holds its stream after ~60 events, so the request is
    still unfinished when the client hangs up however fast this vLLM is. The client hangs
    up once the gateway has read those events: what the gateway bills is what reached it,
    and on a busy machine vLLM's engine runs well ahead of its HTTP server.)"""
    upstream = forwarders(stall_after=20_000)
    meter = RecordingMeter()
    gateway = start_gateway(meter=meter, upstream_url=upstream.url)
    idle = lambda: vllm_metric(vllm_url, "vllm:num_requests_running") == 0  # noqa: E731
    wait_until(idle, "vLLM to finish earlier tests' requests")
    before = vllm_metric(vllm_url, "vllm:generation_tokens_total")
    body = json.dumps(ENDLESS).encode()
    client = socket.create_connection(("127.0.0.1", gateway.settings.port))
    client.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json"
        b"\r\nauthorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
        % (api_key.encode(), len(body), body)
    )
    upstream.wait_stalled()
    wait_until(lambda: upstream.unread_by_clients() == 0, "the gateway to read the events")
    client.close()
    [usage] = meter.wait_settled(1)
    assert usage.outcome == "client_disconnect"
    assert 20 <= usage.completion_tokens < 1500 and usage.prompt_tokens > 0
    wait_until(idle, "vLLM to abort the request")  # the hang-up reached vLLM too
    assert usage.completion_tokens <= vllm_metric(vllm_url, "vllm:generation_tokens_total") - before


def test_a_stream_of_several_choices_cut_short_bills_every_choice(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    api_key: str,
) -> None:
    """vLLM's per-chunk usage counts one choice; the request's is the sum over choices.
    (The forwarder holds the stream after ~130 events, so the gateway cannot have relayed
    all of it into socket buffers before the client hangs up.)"""
    upstream = forwarders(stall_after=40_000)
    meter = RecordingMeter()
    gateway = start_gateway(meter=meter, upstream_url=upstream.url)
    body = {**ENDLESS, "n": 3, "stream": True}
    tokens_seen = 0
    headers = {"authorization": f"Bearer {api_key}"}
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                (choice,) = json.loads(line[6:])["choices"]
                tokens_seen += "role" not in choice["delta"]  # a token (or more) per chunk
                if tokens_seen == 60:
                    break
    [usage] = meter.wait_settled(1)
    assert usage.outcome == "client_disconnect"
    assert 60 <= usage.completion_tokens < 3 * 1500


#: A gateway, its SDK client, its meter and the stalling forwarder in front of vLLM.
Stalling = tuple[GatewayServer, openai.OpenAI, RecordingMeter, Forwarder]


@pytest.fixture
def stalling(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    vllm_url: str,
    api_key: str,
) -> Stalling:
    """A gateway ending requests at MAX_DURATION_S, its SDK client and its meter, in front
    of an upstream that stalls after its first events (a hung engine that keeps the
    connection), once vLLM is idle.

    vLLM answers slowly while it still runs a request whose client stopped reading: each
    request starts on an idle engine, so that its first tokens come before its deadline.
    The deadline leaves room for a busy 2-core machine (at 3 s, a request's first token
    came after it once in ~10 runs: the role chunk only, so 0 tokens billed, rightly)."""
    stalled = forwarders(stall_after=3000)
    meter = RecordingMeter()
    gateway = start_gateway(
        meter=meter, upstream_url=stalled.url, max_request_duration_s=MAX_DURATION_S
    )
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)
    wait_until(lambda: vllm_idle(vllm_url), "vLLM to finish earlier tests' requests")
    return gateway, client, meter, stalled


def vllm_idle(vllm_url: str) -> bool:
    return vllm_metric(vllm_url, "vllm:num_requests_running") == 0


def test_a_request_at_its_maximum_duration_ends_and_pays_what_was_generated(
    stalling: Stalling, vllm_url: str, api_key: str
) -> None:
    """The upstream stalls: the gateway ends the request at CSTACK_MAX_REQUEST_DURATION_S,
    streaming or not, and bills the tokens that came before the stall.

    What came before the deadline is vLLM's timing, not the gateway's: on a loaded 2-core
    machine vLLM's HTTP process has been seen to stop for seconds while its engine runs,
    and a request whose first token reached the gateway after the deadline rightly paid 0.
    So what must be billed is read from the forwarder: a request whose stream it stalled
    had its first ~15 events reach the gateway before the deadline (a connection the
    gateway had dropped could not take them), so it pays for some tokens; and the stream
    pays at least a token for each content chunk the client received. Neither request pays
    more than vLLM generated."""
    gateway, client, meter, stalled = stalling
    generated_before = vllm_metric(vllm_url, "vllm:generation_tokens_total")
    stream = client.chat.completions.create(
        model="composer-2.5",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=1500,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    content_chunks = 0
    with pytest.raises(openai.APIError) as ended:
        for chunk in stream:
            content_chunks += any(choice.delta.content for choice in chunk.choices)
    assert ended.value.code == "max_duration_exceeded"
    first_stalled = stalled.reports("stalled") == 1

    wait_until(lambda: vllm_idle(vllm_url), "vLLM to abort the stalled stream")
    response = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        json=ENDLESS,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=60,
    )
    assert response.status_code == 504
    assert response.headers["x-should-retry"] == "false"  # the same request would end alike
    assert response.json()["error"]["code"] == "max_duration_exceeded"
    assert response.json()["error"]["type"] == "server_error"
    second_stalled = stalled.reports("stalled") == 1 + first_stalled

    streamed, whole = meter.wait_settled(2)
    assert [streamed.outcome, whole.outcome] == ["max_duration", "max_duration"]
    assert content_chunks <= streamed.completion_tokens < 1500
    assert streamed.completion_tokens > 0 or not first_stalled
    assert whole.completion_tokens > 0 or not second_stalled
    wait_until(lambda: vllm_idle(vllm_url), "vLLM to abort the second request")
    generated = vllm_metric(vllm_url, "vllm:generation_tokens_total") - generated_before
    assert whole.completion_tokens < 1500
    assert streamed.completion_tokens + whole.completion_tokens <= generated
    assert all(a.max_duration_s == MAX_DURATION_S for a in meter.admitted)


def test_a_responses_stream_at_its_maximum_duration_fails_and_pays_what_was_generated(
    stalling: Stalling,
) -> None:
    """The Responses API's stream ends as OpenAI's fail: ``response.failed``, its Response
    carrying the error and the usage billed until the stall."""
    _, client, meter, _ = stalling
    # Greedy: the tiny model's answer to this prompt runs past the forwarder's stall (a
    # sampled one could end at the end-of-text token first; responses have no ignore_eos).
    with client.responses.stream(
        model="composer-2.5", input="Tell a long story.", max_output_tokens=1500, temperature=0
    ) as stream:
        events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.error is not None and "max_duration_exceeded" in failed.error.message
    [usage] = meter.wait_settled(1)
    assert usage.outcome == "max_duration"
    assert failed.usage is not None and failed.usage.output_tokens == usage.completion_tokens
