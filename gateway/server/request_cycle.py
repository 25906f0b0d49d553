"""One request on a connection of the gateway's HTTP/1.1 protocol (``gateway.server.http11``)
and its response: ASGI's ``receive`` and ``send`` for the app, the response's head and
its framing (content-length, chunked, HEAD), and the app's task.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
from typing import Any, Protocol

from gateway.errors import error_body
from gateway.server.hang_up import HANG_UP

logger = logging.getLogger(__name__)

_STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
    for status in http.HTTPStatus
}


#: The response headers the framing of its body reads.
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))


def _status_line(status: int) -> bytes:
    return _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status


def error_response(
    status: int, message: str, code: str, kind: str = "invalid_request_error"
) -> bytes:
    """A whole response in OpenAI's error shape, closing the connection."""
    body = json.dumps(error_body(message, kind, None, code)).encode()
    return (
        _status_line(status) + b"content-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )


class Connection(Protocol):
    """What a request needs of its connection (``http11.HttpProtocol``)."""

    server_state: Any
    read_paused: bool
    #: Set while the transport's buffer is full; the app's writes wait on it.
    writable: asyncio.Event | None

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def resume_reading(self) -> None: ...

    def answered(self, cycle: RequestCycle) -> None: ...


class RequestCycle:
    """One request and its response: ASGI's ``receive`` and ``send`` for the app."""

    __slots__ = (
        "body",
        "body_size",
        "bodyless",
        "chunked",
        "complete",
        "delivered",
        "disconnected",
        "expect_continue",
        "keep_alive",
        "length_left",
        "more_body",
        "protocol",
        "scope",
        "started",
        "task",
        "waiter",
    )

    def __init__(
        self, protocol: Connection, scope: dict[str, Any], keep_alive: bool, expect: bool
    ) -> None:
        self.protocol = protocol
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_continue = expect
        self.body: list[bytes] = []
        self.body_size = 0
        self.more_body = True
        #: The whole body was handed to the app: ``receive`` now waits for the end.
        self.delivered = False
        #: What ``receive`` waits on; every waiting caller is woken.
        self.waiter: asyncio.Event | None = None
        #: The response carries no body (HEAD, 204, 304): what the app sends is dropped.
        self.bodyless = False
        self.task: asyncio.Task[None] | None = None
        self.disconnected = False
        self.started = False
        self.complete = False
        self.chunked = False
        #: Body bytes the response's content-length still owes (None: no length).
        self.length_left: int | None = None

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.set()

    def lost(self) -> None:
        if not self.complete:
            self.disconnected = True
            hang_up = self.scope[HANG_UP]
            hang_up.fire()
        self.wake()

    async def run(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except Exception as exc:
            logger.error("unhandled error in the ASGI app", exc_info=exc)
            if not self.started and not self.disconnected:
                self._send_500()
            elif not self.complete:
                self.protocol.close()
        except BaseException:  # cancelled (a shutdown past its grace): no answer to finish
            if not self.complete:
                self.protocol.close()
            raise
        else:
            if not self.complete and not self.disconnected:
                logger.error("the ASGI app returned without completing its response")
                if not self.started:
                    self._send_500()
                else:
                    self.protocol.close()
        finally:
            self.protocol.server_state.tasks.discard(self.task)

    def _send_500(self) -> None:
        self.started = self.complete = True
        protocol = self.protocol
        protocol.write(error_response(500, "internal error", "internal_error", "server_error"))
        protocol.close()
        protocol.answered(self)

    async def receive(self) -> dict[str, Any]:
        protocol = self.protocol
        if self.expect_continue:
            self.expect_continue = False
            if not self.started:
                protocol.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while not (self.disconnected or self.complete) and (
            self.delivered or (self.more_body and not self.body)
        ):
            if protocol.read_paused:
                protocol.resume_reading()
            if self.waiter is None:
                self.waiter = asyncio.Event()
            await self.waiter.wait()
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self.body_size = 0
        self.delivered = not self.more_body
        if protocol.read_paused:
            protocol.resume_reading()
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        protocol = self.protocol
        if protocol.writable is not None and not self.disconnected:
            await protocol.writable.wait()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {kind}")
            self._start(message["status"], message.get("headers", ()))
            return
        if self.complete:
            raise RuntimeError(f"{kind} after the response completed")
        if kind != "http.response.body":
            raise RuntimeError(f"expected http.response.body, got {kind}")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.bodyless:
            data = b""
        elif self.chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            data = body
            if self.length_left is not None:
                self.length_left -= len(body)
                if self.length_left < 0 or (not more and self.length_left):
                    raise RuntimeError("response body and its content-length differ")
        if more:
            if data:
                protocol.write(data)
            return
        protocol.write(data)
        self.complete = True
        self.body = []  # what was not read is dropped as it arrives, not kept
        self.body_size = 0
        self.wake()
        if not self.keep_alive:
            protocol.close()
        protocol.answered(self)

    def _start(self, status: int, headers: Any) -> None:
        parts = [_status_line(status)]
        for name, value in self.protocol.server_state.default_headers:
            parts += (name, b": ", value, b"\r\n")
        close_asked = False
        for name, value in headers:  # ASGI's header names are lowercase
            if name in _FRAMING:
                if name == b"content-length":
                    self.length_left = int(value)
                elif name == b"transfer-encoding":
                    self.chunked = value.lower() == b"chunked"
                elif b"close" in value.lower():
                    self.keep_alive = False
                    close_asked = True
            parts += (name, b": ", value, b"\r\n")
        lines = len(parts) // 4 + 1
        if self.expect_continue and self.more_body:
            # Answered before the body its client holds back until asked: what the client
            # sends next may be that body or a request, so the connection ends here.
            self.keep_alive = False
        if not self.keep_alive and not close_asked:
            parts.append(b"connection: close\r\n")
            lines += 1
        self.bodyless = self.scope["method"] == "HEAD" or status in (204, 304)
        if self.length_left is None and not self.chunked and not self.bodyless:
            self.chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
            lines += 1
        parts.append(b"\r\n")
        head = b"".join(parts)
        # One line break per line: none inside a name or value (a response split).
        if head.count(b"\n") != lines + 1 or head.count(b"\r") != lines + 1:
            raise RuntimeError("a response header holds a line break")
        self.started = True
        self.expect_continue = False
        self.protocol.write(head)
