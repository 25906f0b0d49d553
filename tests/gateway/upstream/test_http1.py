"""The upstream client against a real vLLM: connections are kept alive and reused."""

from __future__ import annotations

import asyncio

import httpx
import pydantic_core
import pytest

from gateway.upstream.http1 import ConnectionPool

pytestmark = pytest.mark.vllm


def test_sequential_requests_reuse_one_connection(vllm_url: str) -> None:
    """A new TCP connection per request would cost a connect (and a TIME_WAIT socket)
    per request; httptools forgets keep-alive once a message completes, which once made
    this client open one for every request."""

    served_model = httpx.get(f"{vllm_url}/v1/models").json()["data"][0]["id"]

    async def exchange() -> tuple[int, list[int]]:
        pool = ConnectionPool(vllm_url, limit=8, connect_timeout_s=5, read_timeout_s=60)
        statuses = []
        try:
            for stream in (False, True, False, True):
                body = {"model": served_model, "prompt": "hi", "max_tokens": 2, "stream": stream}
                response = await pool.request(
                    "/v1/completions",
                    pydantic_core.to_json(body),
                    {"content-type": "application/json"},
                )
                await response.read()
                response.close()
                statuses.append(response.status)
                statuses.append(await pool.get_status("/health"))
            return pool.opened, statuses
        finally:
            pool.close()

    opened, statuses = asyncio.run(exchange())
    assert statuses == [200] * 8
    assert opened == 1


def test_a_request_waiting_at_the_limit_gets_the_released_slot(vllm_url: str) -> None:
    """At the connection limit a finished connection is closed, not pooled: pooled, it
    would keep its slot from the waiting request until the upstream's idle timeout."""
    served_model = httpx.get(f"{vllm_url}/v1/models").json()["data"][0]["id"]
    body = pydantic_core.to_json({"model": served_model, "prompt": "hi", "max_tokens": 2})
    headers = {"content-type": "application/json"}

    async def exchange() -> tuple[int, int, int]:
        pool = ConnectionPool(vllm_url, limit=1, connect_timeout_s=5, read_timeout_s=60)
        try:
            first = await pool.request("/v1/completions", body, headers)
            waiting = asyncio.ensure_future(pool.request("/v1/completions", body, headers))
            await asyncio.sleep(0.1)
            assert not waiting.done()  # no slot until the first exchange ends
            await first.read()
            first.close()
            idle_after_close = len(pool._idle)
            second = await asyncio.wait_for(waiting, timeout=60)
            await second.read()
            second.close()
            return first.status, second.status, idle_after_close
        finally:
            pool.close()

    assert asyncio.run(exchange()) == (200, 200, 0)


def test_a_pooled_connection_closed_before_its_reuse_sends_on_a_fresh_one(vllm_url: str) -> None:
    """An upstream that dies leaves its pooled connections closed before their
    ``connection_lost`` runs, and uvloop (the gateway's loop) raises RuntimeError ("unable
    to perform operation on <TCPTransport closed=True ...>; the handler is closed") on a
    write to one: seen when a replica was killed under load, it was a 500. Nothing was
    sent, so the request goes on a fresh connection instead. That moment cannot be timed
    from outside, so the pooled connection's transport is swapped for one in that state."""
    import uvloop

    class ClosedHandle:
        def is_closing(self) -> bool:
            return False  # the state seen: closed underneath, not yet said so

        def write(self, data: bytes) -> None:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")

        def abort(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    async def exchange() -> tuple[int, int]:
        pool = ConnectionPool(vllm_url, limit=8, connect_timeout_s=5, read_timeout_s=60)
        try:
            assert await pool.get_status("/health") == 200
            (pooled,) = pool._idle
            real = pooled.transport
            assert real is not None
            pooled.transport = ClosedHandle()  # type: ignore[assignment]
            status = await pool.get_status("/health")
            real.abort()
            return status, pool.opened
        finally:
            pool.close()

    status, opened = uvloop.run(exchange())
    assert status == 200
    assert opened == 2
