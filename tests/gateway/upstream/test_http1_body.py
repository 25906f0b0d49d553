"""The upstream client's body reading against a raw HTTP/1.1 server: what arrived together
is handed on in one piece, and a reader that falls behind pauses the socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from gateway.upstream.http1 import BUFFER_HIGH_WATER, ConnectionPool

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(events: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events) + b"0\r\n\r\n"


@asynccontextmanager
async def raw_upstream(answer: Callable[[asyncio.StreamWriter], object]) -> AsyncIterator[str]:
    """A server that reads a request head and lets ``answer`` write the response."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        result = answer(writer)
        if asyncio.iscoroutine(result):
            await result
        await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def test_events_that_arrive_together_come_out_in_one_piece() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(50)] + [b"data: [DONE]\n\n"]

    async def exchange() -> list[bytes]:
        async with raw_upstream(lambda writer: writer.write(HEAD + chunked(events))) as url:
            pool = ConnectionPool(url, limit=1, connect_timeout_s=5, read_timeout_s=30)
            try:
                response = await pool.request("/v1/chat/completions", b"{}", {})
                pieces = [piece async for piece in response]
                response.close()
                return pieces
            finally:
                pool.close()

    pieces = asyncio.run(exchange())
    assert b"".join(pieces) == b"".join(events)
    assert len(pieces) < len(events) / 5  # one write, a read or a few: not 51 steps


def test_a_reader_that_falls_behind_pauses_the_upstream_and_loses_nothing() -> None:
    events = [b"data: " + b"x" * 4000 + b"%d\n\n" % i for i in range(1000)]  # about 4 MB
    body = chunked(events)

    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)
        for start in range(0, len(body), 65536):
            writer.write(body[start : start + 65536])
            await writer.drain()

    async def exchange() -> tuple[int, bool, bytes]:
        async with raw_upstream(answer) as url:
            pool = ConnectionPool(url, limit=1, connect_timeout_s=5, read_timeout_s=30)
            try:
                response = await pool.request("/v1/chat/completions", b"{}", {})
                await asyncio.sleep(0.5)  # the reader is busy elsewhere
                buffered = response._buffered
                paused = response._connection._reading_paused
                received = b"".join([piece async for piece in response])
                response.close()
                return buffered, paused, received
            finally:
                pool.close()

    buffered, paused, received = asyncio.run(exchange())
    assert paused
    assert BUFFER_HIGH_WATER < buffered < 2 * BUFFER_HIGH_WATER
    assert received == b"".join(events)
