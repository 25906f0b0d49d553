"""Faults on real processes: a replica killed during a run, an upstream killed mid-stream,
a client hanging up mid-stream (the gateway drops the request upstream)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from serving.process import free_port
from tests.support.commands import cstack_command
from tests.support.fakes.replica import Forwarder
from tests.support.gateway import GatewayServer, RecordingMeter, metric_value
from tests.support.waits import wait_until

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Tell a long story."}]
#: Long generations so the fault lands while tokens are still flowing.
ENDLESS = {"ignore_eos": True}


def endless_stream(
    client: openai.OpenAI, model: str = "composer-2.5", max_tokens: int = 1500
) -> openai.Stream[ChatCompletionChunk]:
    """A stream that runs to ``max_tokens`` whatever the weights (end-of-turn ignored)."""
    return client.chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        extra_body=ENDLESS,
    )


def endless_finish_reason(client: openai.OpenAI, model: str, max_tokens: int) -> str:
    """A non-streaming request that runs to ``max_tokens``: its finish reason."""
    response = client.chat.completions.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        extra_body=ENDLESS,
    )
    return response.choices[0].finish_reason


def test_replica_killed_during_a_run_requests_keep_succeeding(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[[], Forwarder],
    vllm_url: str,
    api_key: str,
) -> None:
    # The doomed replica stops relaying its answers early, so what it was sent is still in
    # flight when it dies however fast the engine is.
    doomed = forwarders(stall_after=2000)
    gateway = start_gateway(
        fast_upstream_urls=[doomed.url, vllm_url],
        standard_upstream_urls=[vllm_url],
        # Same prompt every time: prefix routing would send all of them to whichever
        # replica got the first, perhaps the live one. Failover is what is tested here.
        routing="least_outstanding",
    )
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)

    def one_request(max_tokens: int) -> str:
        return endless_finish_reason(client, "composer-2.5-fast", max_tokens)

    with ThreadPoolExecutor(max_workers=4) as pool:
        # Four long requests spread over both replicas by least-outstanding balancing
        # (ties alternate, so the doomed one gets at least one of them)...
        caught = [pool.submit(one_request, 64) for _ in range(4)]
        doomed.wait_stalled()
        doomed.kill()  # ...then a crash with its share of them in flight.
        after = list(pool.map(one_request, [12] * 12))
    assert [future.result() for future in caught] == ["length"] * 4
    assert after == ["length"] * 12

    def fast_metrics() -> str:
        return httpx.get(f"{gateway.internal_url}/metrics").text

    wait_until(
        lambda: metric_value(fast_metrics(), "cstack_upstream_healthy", tier="fast") == 1,
        "the dead fast replica to be marked down",
        timeout_s=10,
        interval_s=0.1,
    )
    metrics = fast_metrics()
    assert metric_value(metrics, "cstack_upstream_replicas", tier="fast") == 2
    # Requests caught on the dead replica went to the live one instead of failing.
    assert metric_value(metrics, "cstack_upstream_retries_total", tier="fast") >= 1
    ready = httpx.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200 and ready.json()["healthy_upstreams"] == {
        "fast": 1,
        "standard": 1,
    }


def test_upstream_killed_mid_stream_gives_a_well_formed_error(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    api_key: str,
) -> None:
    # The stream stalls after ~8 events, so the kill below lands while it is unfinished.
    upstream = forwarders(stall_after=2000)
    meter = RecordingMeter()
    gateway = start_gateway(meter=meter, upstream_url=upstream.url)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0, timeout=60)
    stream = endless_stream(client)
    received = 0
    with pytest.raises(openai.APIError) as failure:
        for _chunk in stream:
            received += 1
            if received == 3:
                upstream.kill()
    assert "upstream" in failure.value.message
    assert received >= 3
    [usage] = meter.wait_settled(1)
    assert usage.outcome == "upstream_error"
    # Billing still learns the tokens generated before the cut.
    assert usage.prompt_tokens > 0 and usage.completion_tokens >= 2
    metrics = httpx.get(f"{gateway.internal_url}/metrics").text
    assert (
        metric_value(metrics, "cstack_upstream_errors_total", tier="fast", kind="stream_cut") == 1
    )
    assert metric_value(metrics, "cstack_inflight_requests", tier="fast") == 0


def test_client_disconnect_mid_stream_drops_the_upstream_request(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    vllm_url: str,
    api_key: str,
) -> None:
    """The client hangs up after 3 events: the gateway drops its connection upstream (what
    makes vLLM abort the request) and bills what it relayed.

    The forwarder in front of vLLM holds the stream after ~15 events, so the gateway cannot
    have read the whole answer before the hang-up: only the gateway's closing can end the
    connection. (Counting vLLM's tokens instead cannot show the abort on a loaded 2-core
    machine: vLLM's HTTP process there stops for 3-7 s at a time while its engine process
    runs on, so the whole answer was sometimes generated before the first 3 events reached
    the client, and there was nothing left to abort.)"""
    upstream = forwarders(stall_after=3000)
    meter = RecordingMeter()
    gateway = start_gateway(meter=meter, upstream_url=upstream.url)
    body = {
        "model": "composer-2.5",
        "messages": MESSAGES,
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }
    headers = {"authorization": f"Bearer {api_key}"}
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as response:
        assert response.status_code == 200
        events = 0
        for line in response.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                upstream.wait_stalled()
                break  # leaving the loop closes the client's connection mid-stream
    upstream.wait_hung_up()
    [usage] = meter.wait_settled(1)
    assert usage.outcome == "client_disconnect"
    assert usage.tier == "fast" and 2 <= usage.completion_tokens < 1500

    # Not a check (vLLM's abort is its own timing, above): later tests want an idle engine.
    def idle() -> bool:
        metrics = httpx.get(f"{vllm_url}/metrics").text
        return metric_value(metrics, "vllm:num_requests_running") == 0

    wait_until(idle, "vLLM to end the dropped request", 120)


def test_silent_upstream_times_out_with_a_504(
    start_gateway: Callable[..., GatewayServer], api_key: str
) -> None:
    """An upstream that accepts connections and never answers (a hung engine)."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)  # the kernel completes handshakes; nobody ever reads or answers
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        gateway = start_gateway(upstream_url=url, read_timeout_s=1.0, health_timeout_s=0.5)
        assert httpx.get(f"{gateway.url}/readyz").status_code == 503
        response = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "composer-2.5", "messages": MESSAGES, "max_tokens": 2},
            headers={"authorization": f"Bearer {api_key}"},
            timeout=30,
        )
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_unavailable"
    metrics = httpx.get(f"{gateway.internal_url}/metrics").text
    assert metric_value(metrics, "cstack_upstream_errors_total", tier="fast", kind="timeout") == 1


def answer_six_fast_requests(client: openai.OpenAI) -> None:
    """Three non-streaming and three streaming fast requests, each answered in full."""
    for stream in (False, True) * 3:
        if stream:
            chunks = endless_stream(client, "composer-2.5-fast", max_tokens=2)
            assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == "length"
        else:
            assert endless_finish_reason(client, "composer-2.5-fast", max_tokens=2) == "length"


def test_a_5xx_before_any_byte_is_retried_on_another_replica(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    vllm_url: str,
    api_key: str,
) -> None:
    """An overloaded replica (healthy, but every POST answers 503) costs no request: each
    one that lands there first is sent once more, to the other replica."""
    overloaded = forwarders(overloaded=True)
    # Least outstanding: prefix routing would send these identical prompts to the replica
    # that answered the first one, and never try the overloaded one again.
    gateway = start_gateway(
        fast_upstream_urls=[overloaded.url, vllm_url],
        standard_upstream_urls=[overloaded.url],
        routing="least_outstanding",
    )
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)
    answer_six_fast_requests(client)
    metrics = httpx.get(f"{gateway.internal_url}/metrics").text
    retries = metric_value(metrics, "cstack_upstream_retries_total", tier="fast")
    errors = metric_value(metrics, "cstack_upstream_errors_total", tier="fast", kind="status_5xx")
    # Ties rotate once per request, so every other request tries the overloaded one first.
    assert retries == errors == 3
    # A tier with no other replica has nothing to retry on: the 503 becomes a 502 that
    # says nothing of the engine's insides (its message is logged, not relayed).
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(
            model="composer-2.5-standard", messages=MESSAGES, max_tokens=2
        )
    assert caught.value.status_code == 502
    assert caught.value.body == {
        "message": "The model server failed the request.",
        "type": "server_error",
        "param": None,
        "code": "upstream_error",
    }


def test_prefix_routing_keeps_a_conversation_off_the_replica_that_failed_it(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    vllm_url: str,
    api_key: str,
) -> None:
    """With prefix routing (the default), a prompt is remembered on the replica that
    answered it, never on one that failed it: after at most one retry, the same
    conversation goes straight to the working replica."""
    overloaded = forwarders(overloaded=True)
    gateway = start_gateway(fast_upstream_urls=[overloaded.url, vllm_url])
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)
    answer_six_fast_requests(client)
    metrics = httpx.get(f"{gateway.internal_url}/metrics").text
    assert metric_value(metrics, "cstack_upstream_retries_total", tier="fast") <= 1


def test_sigterm_with_a_stream_in_flight_exits_within_the_grace(
    forwarders: Callable[..., Forwarder], redis_url: str, api_key: str, tmp_path: Path
) -> None:
    """`cstack gateway` on SIGTERM lets in-flight requests finish for CSTACK_SHUTDOWN_GRACE_S,
    then cancels them and exits: an endless stream cannot keep it (or its pod) alive."""
    # The upstream stalls the stream, so it is still running when the grace runs out.
    upstream = forwarders(stall_after=2000)
    port = free_port()
    env = {
        **os.environ,
        "CSTACK_REDIS_URL": redis_url,
        "CSTACK_UPSTREAM_URL": upstream.url,
        "CSTACK_BILLING": "false",
        "CSTACK_SHUTDOWN_GRACE_S": "1",
    }
    log = (tmp_path / "gateway.log").open("wb")
    gateway = subprocess.Popen(
        cstack_command("gateway", "--port", str(port)), env=env, stdout=log, stderr=log
    )
    try:

        def ready() -> bool:
            assert gateway.poll() is None, "cstack gateway exited at start"
            return _ready(f"http://127.0.0.1:{port}/readyz")

        wait_until(ready, "cstack gateway to become ready", timeout_s=60, interval_s=0.1)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=api_key, max_retries=0, timeout=60
        )
        stream = endless_stream(client)
        next(iter(stream))
        gateway.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        with contextlib.suppress(openai.APIError, httpx.HTTPError):
            for _chunk in stream:
                pass
        # uvicorn re-raises the signal once its shutdown is done: "terminated by SIGTERM".
        assert gateway.wait(timeout=30) == -signal.SIGTERM
        assert time.monotonic() - stopped_at < 15
    finally:
        if gateway.poll() is None:
            gateway.kill()
        log.close()
    logged = (tmp_path / "gateway.log").read_text()
    assert "Cancel 1 running task(s), timeout graceful shutdown exceeded" in logged
    assert "Application shutdown complete" in logged


def _ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url).status_code == 200
    return False
