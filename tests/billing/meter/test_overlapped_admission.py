"""A request of a key clear of its limits goes upstream while its admission is on its way
(gateway/api/admission.py), through a real gateway process with billing's real Meter, and is
answered only once billing has admitted it; a refusal arriving after the request went
upstream drops it there and is the client's answer; a request that ends while its
admission is on its way still settles the reservation that admission made.

Billing's scripts are held back with ``CLIENT PAUSE ... WRITE`` (reads, such as the key
lookup, go on), so "the upstream has it while billing has not answered" is a state the
test waits for, not a race it hopes to win.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import uvicorn
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from billing.meter.protocol import Admission, AdmissionRequest
from billing.settings import BillingSettings
from gateway.access.keys import KeyStore
from gateway.api.admission import MAX_OVERLAPPED_PER_KEY, OVERLAP_HEADROOM, AdmissionStanding
from serving.process import free_port
from tests.support.billing import keyspace, port_open, usage_entries
from tests.support.fakes.upstream import events, health, models
from tests.support.gateway_processes import gateway_processes
from tests.support.waits import wait_until

CHAT = {"model": "composer-2.5", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4}  # fmt: skip


class Upstream:
    """An OpenAI-speaking upstream in a thread that records what reaches it: each
    request's ``x-request-id`` as it arrives, and those whose client (the gateway) hung up
    before they were answered. While ``hold`` is set it answers nothing."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.dropped: list[str] = []
        self.hold = threading.Event()
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._generate, methods=["POST"]),
                Route("/health", health),
                Route("/v1/models", models),
            ]
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def _generate(self, request: Request) -> Response:
        body = json.loads(await request.body())
        request_id = request.headers["x-request-id"]
        self.arrived.append(request_id)
        while self.hold.is_set():
            if await request.is_disconnected():
                self.dropped.append(request_id)
                return Response()
            await asyncio.sleep(0.01)
        stream = events(request.url.path, body, random.Random(request_id))
        return StreamingResponse(stream, media_type="text/event-stream")


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    server.thread.start()
    wait_until(lambda: port_open(server.port), "the stand-in upstream to listen", 30)
    yield server
    server.server.should_exit = True
    server.thread.join(timeout=10)


@pytest.fixture
def gateway(billing_settings: BillingSettings, upstream: Upstream, tmp_path: Path) -> Iterator[str]:
    values = {
        **billing_settings.model_dump(),
        "engine_admission": "false",
        # Billing is held back on purpose here: its calls must wait, not time out.
        "redis_timeout_s": 60,
    }
    with gateway_processes(values, upstream.url, tmp_path, count=1) as (url,):
        yield url


@pytest.fixture
def sync_redis(billing_settings: BillingSettings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(billing_settings.redis_url)
    yield client
    client.execute_command("CLIENT", "UNPAUSE")  # whatever a failed test left paused
    client.close()


def key_for(billing_settings: BillingSettings, org: str) -> str:
    async def create() -> str:
        client = Redis.from_url(billing_settings.redis_url)
        try:
            store = KeyStore(client, "pro")
            await store.create_org(org, plan="pro")
            token, _ = await store.create_key(org, plan="pro")
            return token
        finally:
            await client.aclose()

    return asyncio.run(create())


def clear_key(url: str, billing_settings: BillingSettings, org: str) -> str:
    """A new key of ``org`` whose first request went through: its next one is overlapped
    (the first waits, nothing being known of the key yet)."""
    token = key_for(billing_settings, org)
    first = chat(url, token)
    assert first.status_code == 200, first.text
    return token


def pause_billing(client: redis.Redis) -> None:
    """Billing's scripts wait (reads, such as the key lookup, go on) until CLIENT UNPAUSE."""
    client.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")


def chat(url: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {token}"},
        json=CHAT,
        timeout=120,
    )


def events_of(client: redis.Redis, settings: BillingSettings) -> dict[str, dict[str, Any]]:
    entries = usage_entries(client, settings)
    return {e["event_id"]: e for e in (json.loads(f[b"event"]) for _, f in entries)}


def reserved(client: redis.Redis, settings: BillingSettings, org: str) -> int:
    period = time.strftime("%Y-%m", time.gmtime())
    value = client.hget(keyspace(settings).budget_prefix(org) + period, "reserved")
    return int(value or 0)


def test_a_clear_key_is_sent_upstream_before_its_admission_and_answered_after(
    gateway: str,
    upstream: Upstream,
    sync_redis: redis.Redis,
    billing_settings: BillingSettings,
) -> None:
    token = clear_key(gateway, billing_settings, "org-overlap")
    pause_billing(sync_redis)
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(chat, gateway, token)
        wait_until(lambda: len(upstream.arrived) == 2, "the second request upstream", 30)
        time.sleep(0.5)
        assert not second.done(), "answered before billing admitted it"
        sync_redis.execute_command("CLIENT", "UNPAUSE")
        answer = second.result(timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == upstream.arrived[1]
    assert "x-ratelimit-remaining-requests" in answer.headers
    settled = wait_until(
        lambda: len(found := events_of(sync_redis, billing_settings)) == 2 and found,
        "both requests settled",
        30,
    )
    assert settled[upstream.arrived[1]]["outcome"] == "complete"
    assert settled[upstream.arrived[1]]["completion_tokens"] > 0
    assert reserved(sync_redis, billing_settings, "org-overlap") == 0


def test_a_refusal_after_the_request_went_upstream_drops_it_there_and_is_the_answer(
    gateway: str,
    upstream: Upstream,
    sync_redis: redis.Redis,
    billing_settings: BillingSettings,
) -> None:
    token = clear_key(gateway, billing_settings, "org-overlap-refused")
    # Suspended between two requests: the key's standing cannot have seen it coming.
    sync_redis.set(keyspace(billing_settings).suspended_org("org-overlap-refused"), "in_test")
    upstream.hold.set()
    pause_billing(sync_redis)
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(chat, gateway, token)
        wait_until(lambda: len(upstream.arrived) == 2, "the second request upstream", 30)
        sync_redis.execute_command("CLIENT", "UNPAUSE")
        refused = second.result(timeout=60)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "insufficient_quota" and "suspended" in error["message"]
    assert "x-ratelimit-remaining-requests" in refused.headers
    wait_until(
        lambda: upstream.dropped == [upstream.arrived[1]], "the upstream request dropped", 30
    )

    # Refused once, the key's requests wait for admission again: this one never leaves.
    third = chat(gateway, token)
    assert third.status_code == 429 and third.json()["error"]["code"] == "insufficient_quota"
    assert len(upstream.arrived) == 2
    first_settled = wait_until(
        lambda: events_of(sync_redis, billing_settings), "the first request settled", 30
    )
    assert list(first_settled) == [upstream.arrived[0]]
    assert reserved(sync_redis, billing_settings, "org-overlap-refused") == 0


def test_a_request_whose_client_left_before_its_admission_arrived_settles_it(
    gateway: str,
    upstream: Upstream,
    sync_redis: redis.Redis,
    billing_settings: BillingSettings,
) -> None:
    token = clear_key(gateway, billing_settings, "org-overlap-gone")
    upstream.hold.set()
    pause_billing(sync_redis)
    body = json.dumps(CHAT).encode()
    host, port = gateway.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
            + f"authorization: Bearer {token}\r\ncontent-type: application/json\r\n".encode()
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: len(upstream.arrived) == 2, "the second request upstream", 30)
    # The client is gone: the gateway drops the upstream request while billing, paused,
    # has not answered its admission yet.
    wait_until(
        lambda: upstream.dropped == [upstream.arrived[1]], "the upstream request dropped", 30
    )
    sync_redis.execute_command("CLIENT", "UNPAUSE")
    gone = upstream.arrived[1]
    settled = wait_until(
        lambda: gone in (found := events_of(sync_redis, billing_settings)) and found,
        "the abandoned request settled",
        30,
    )
    assert settled[gone]["outcome"] == "client_disconnect"
    assert settled[gone]["completion_tokens"] == 0
    assert reserved(sync_redis, billing_settings, "org-overlap-gone") == 0


def test_a_burst_from_a_clear_key_goes_ahead_of_its_admissions_only_up_to_the_bound(
    gateway: str,
    upstream: Upstream,
    sync_redis: redis.Redis,
    billing_settings: BillingSettings,
) -> None:
    """With billing held back, a burst of a clear key's requests reaches the upstream
    only up to MAX_OVERLAPPED_PER_KEY (the pro plan leaves the key room for far more);
    the rest wait for their admissions. Once those are back the key overlaps again."""
    token = clear_key(gateway, billing_settings, "org-overlap-burst")
    burst = MAX_OVERLAPPED_PER_KEY + 8
    pause_billing(sync_redis)
    with ThreadPoolExecutor(burst) as pool:
        answers = [pool.submit(chat, gateway, token) for _ in range(burst)]
        wait_until(
            lambda: len(upstream.arrived) == 1 + MAX_OVERLAPPED_PER_KEY, "the bound upstream", 60
        )
        time.sleep(1.0)
        assert len(upstream.arrived) == 1 + MAX_OVERLAPPED_PER_KEY  # the rest wait
        sync_redis.execute_command("CLIENT", "UNPAUSE")
        assert [answer.result(timeout=120).status_code for answer in answers] == [200] * burst
    assert len(upstream.arrived) == 1 + burst
    # Every overlapped admission is back: the key's next request goes ahead again.
    pause_billing(sync_redis)
    with ThreadPoolExecutor(1) as pool:
        after = pool.submit(chat, gateway, token)
        wait_until(lambda: len(upstream.arrived) == 2 + burst, "the next request upstream", 30)
        sync_redis.execute_command("CLIENT", "UNPAUSE")
        assert after.result(timeout=60).status_code == 200


def admission(headroom: int | None) -> Admission:
    request = AdmissionRequest("r", "org", "key", "pro", "fast", "composer-2.5", 1, 1)
    return Admission(request=request, headroom=headroom)


def test_standing_overlaps_only_keys_last_granted_with_headroom() -> None:
    standing = AdmissionStanding(max_keys=2)
    assert not standing.overlaps("a")  # nothing known yet
    standing.granted("a", admission(OVERLAP_HEADROOM))
    assert standing.overlaps("a")
    standing.granted("a", admission(OVERLAP_HEADROOM - 1))  # near a limit
    assert not standing.overlaps("a")
    standing.granted("a", admission(None))  # admitted without Redis: nothing known
    assert not standing.overlaps("a")
    standing.granted("a", admission(100))
    standing.refused("a")
    assert not standing.overlaps("a")
    for key in ("a", "b", "c"):  # past max_keys the memory starts over
        standing.granted(key, admission(100))
    assert [standing.overlaps(k) for k in ("a", "b", "c")] == [False, False, True]


def test_a_clear_key_has_at_most_its_bound_of_overlapped_admissions_on_their_way() -> None:
    """A burst from a clear key goes upstream ahead of its admissions only up to
    headroom // OVERLAP_HEADROOM of them (at most MAX_OVERLAPPED_PER_KEY); the rest wait
    until some are back. Other keys are not held back by it."""
    standing = AdmissionStanding()
    standing.granted("a", admission(3 * OVERLAP_HEADROOM + 1))
    standing.granted("b", admission(10 * OVERLAP_HEADROOM * MAX_OVERLAPPED_PER_KEY))
    for _ in range(3):
        assert standing.overlaps("a")
        standing.started("a")
    assert not standing.overlaps("a")  # three on their way: the fourth waits
    assert standing.overlaps("b")
    standing.ended("a")
    assert standing.overlaps("a")
    for _ in range(MAX_OVERLAPPED_PER_KEY):
        standing.started("b")
    assert not standing.overlaps("b")  # however large the headroom
    for _ in range(MAX_OVERLAPPED_PER_KEY):
        standing.ended("b")
    assert standing.overlaps("b")
    standing.refused("b")
    assert not standing.overlaps("b")
