"""The client's side of a relayed request: noticing that it hung up, and the response
that relays a stream of server-sent events to it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.deadlines import timeout_at
from gateway.server.hang_up import HANG_UP, HangUp

logger = logging.getLogger(__name__)
T = TypeVar("T")
SendEvent = Callable[[bytes], Awaitable[None]]
#: After its deadline a stream gets this long to deliver its error event and end; a
#: client that reads nothing cannot keep the request alive past it.
END_GRACE_S = 10.0


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class Client:
    """The client's side of one request as the relay sees it: ASGI's ``receive``, and the
    server's hang-up notice when the server gives one (``gateway.server.hang_up``)."""

    __slots__ = ("hang_up", "receive")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.receive = receive
        hang_up = scope.get(HANG_UP)
        self.hang_up = hang_up if isinstance(hang_up, HangUp) else None


async def until_disconnect(client: Client, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` unless the client hangs up first (then cancel it: ``ClientGone``).

    The server's hang-up notice cancels the request's own task when the connection is
    lost. Without one, a watcher task waits on ``receive()`` for ``http.disconnect``:
    cheaper on the hot path than running ``work`` as a task of its own and waiting on
    both, dearer than the notice (a task made, stepped and cancelled per request).
    """
    current = asyncio.current_task()
    assert current is not None
    hang_up = client.hang_up
    if hang_up is None or hang_up.gone:
        # Gone already: ``work`` still starts and is cancelled at its first wait, as with
        # a hang-up while it runs (what it opened is closed and settled by its own
        # cleanup); ``receive()`` says so at once.
        return await _until_receive_disconnect(client.receive, work, current)
    hang_up.watch(current.cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if not hang_up.gone:
            raise
        current.uncancel()
        raise ClientGone() from None
    finally:
        hang_up.watch(None)


async def _until_receive_disconnect(
    receive: Receive, work: Awaitable[T], current: asyncio.Task[Any]
) -> T:
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        current.cancel()

    watcher = asyncio.create_task(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        current.uncancel()
        raise ClientGone() from None
    finally:
        watcher.cancel()


def client_closed_request() -> Response:
    """Nobody reads it; 499 (nginx's "client closed request") is what metrics count."""
    return Response(status_code=499)


class JSONAnswer(Response):
    """An assembled answer: Starlette's ``Response`` with its head made directly (its own
    header assembly costs twice as much, on every unstreamed request)."""

    media_type = "application/json"

    def __init__(self, content: bytes, headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.body = content
        self.raw_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(content)),
            *[(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()],
        ]


class SSEResponse(Response):
    """Server-sent events relayed from upstream; a client hang-up cancels the relay."""

    media_type = "text/event-stream"

    def __init__(
        self,
        pump: Callable[[SendEvent], Coroutine[Any, Any, None]],
        headers: dict[str, str],
        deadline: float,
        client: Client,
    ):
        # Not Response.__init__: it would render an empty body and send content-length: 0.
        self.status_code = 200
        self.background = None
        self.init_headers({**headers, "cache-control": "no-cache"})
        self._pump = pump
        self._deadline = deadline
        #: The request's client, as the relay watched it while opening the upstream.
        self._client = client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )

        async def send_event(event: bytes) -> None:
            await send({"type": "http.response.body", "body": event, "more_body": True})

        try:
            with timeout_at(self._deadline + END_GRACE_S):
                try:
                    await until_disconnect(self._client, self._pump(send_event))
                except ClientGone:
                    return
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            # The pump has settled; uvicorn closes a connection whose response is unfinished.
            logger.warning("a stream's client read nothing past the deadline; dropped")
