"""A client hanging up mid-request, as the relay notices it: through the gateway's HTTP
protocol's hang-up notice (a real uvicorn server on a real socket, no watcher task), and
through ASGI's ``receive`` where a server gives no notice."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from gateway.api.downstream import Client, ClientGone, until_disconnect
from gateway.server.hang_up import HANG_UP, HangUp
from gateway.server.http11 import protocol_for
from gateway.settings import GatewaySettings


class _HangUpApp:
    """Waits in ``until_disconnect`` on work that never ends; records what ended it."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.ended: asyncio.Future[str] | None = None
        self.notice: object = None
        self.tasks_while_waiting = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.ended = asyncio.get_running_loop().create_future()
        self.notice = scope.get(HANG_UP)
        while (await receive()).get("more_body"):
            pass

        async def forever() -> None:
            self.waiting.set()
            await asyncio.Event().wait()

        try:
            await until_disconnect(Client(scope, receive), forever())
        except ClientGone:
            self.ended.set_result("client gone")
        except BaseException as exc:
            self.ended.set_result(type(exc).__name__)
            raise


async def test_the_protocols_notice_ends_the_wait_when_the_client_hangs_up() -> None:
    app = _HangUpApp()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        app, http=protocol_for(GatewaySettings()), lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
        )
        await asyncio.wait_for(app.waiting.wait(), 10)
        # Only the request's own task waits: no watcher task per request.
        others = {t for t in asyncio.all_tasks() if t.get_coro().__name__ == "watch"}  # type: ignore[union-attr]
        assert not others
        writer.close()
        assert app.ended is not None
        assert await asyncio.wait_for(app.ended, 10) == "client gone"
        assert isinstance(app.notice, HangUp) and app.notice.gone
    finally:
        server.should_exit = True
        await serving


async def test_without_a_notice_the_wait_ends_on_receives_disconnect() -> None:
    disconnected = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def forever() -> None:
        await asyncio.Event().wait()

    client = Client({"type": "http"}, receive)
    assert client.hang_up is None
    waiting = asyncio.create_task(until_disconnect(client, forever()))
    await asyncio.sleep(0.01)
    disconnected.set()
    with pytest.raises(ClientGone):
        await asyncio.wait_for(waiting, 10)


async def test_a_client_gone_before_the_wait_still_runs_the_work_to_its_first_wait() -> None:
    """The work starts and is cancelled at its first wait, so that its own cleanup (the
    upstream connection closed, the request settled) runs as for a hang-up meanwhile."""
    steps: list[str] = []

    async def work() -> None:
        steps.append("started")
        try:
            await asyncio.Event().wait()
        finally:
            steps.append("cleaned up")

    notice = HangUp()
    notice.fire()

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}  # the server says so too, at once

    with pytest.raises(ClientGone):
        await asyncio.wait_for(until_disconnect(Client({HANG_UP: notice}, receive), work()), 10)
    assert steps == ["started", "cleaned up"]


async def test_a_cancel_that_is_not_a_hang_up_stays_a_cancel() -> None:
    notice = HangUp()

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def forever() -> None:
        await asyncio.Event().wait()

    waiting = asyncio.create_task(until_disconnect(Client({HANG_UP: notice}, receive), forever()))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    notice.fire()  # after the wait: nobody watches any more, nothing is cancelled
