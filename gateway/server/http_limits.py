"""HTTP/1.1 with limits uvicorn does not have: the request line and headers together at
most ``max_header_bytes`` and ``max_headers`` fields (else 431), the whole head within
``header_timeout_s`` of the connection's first byte or of the previous response
(slow-loris clients are dropped), and the whole body within ``body_timeout_s`` of the head
(then the connection is closed; the app sees the client gone). Each request's scope holds
a hang-up notice (``gateway.server.hang_up``), fired when its connection is lost. Its
writes are corked (``CorkedTransport``): what one event-loop iteration writes leaves in
one send, so an unstreamed answer's head and body cost one system call, not two.

``LimitedHttpProtocol`` subclasses uvicorn's ``httptools_impl.HttpToolsProtocol``, which
is not a public API: uvicorn offers no hook into its parser callbacks, and these limits
must count bytes and fields as the head is parsed, before uvicorn builds a request from
it. Its overridden methods (``on_url``, ``on_header``, ``on_headers_complete``,
``on_message_complete``, ``on_response_complete``, ``send_400_response``) may change in
any uvicorn release, so uvicorn (and httptools) are pinned: the images install with
``constraints-cpu.txt`` (deploy/docker/app.Dockerfile), the versions the tests ran
(``tests/security/test_http.py`` holds the gateway to these limits).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.deadlines import Deadline
from gateway.errors import error_body
from gateway.server.hang_up import HANG_UP, HangUp
from gateway.settings import GatewaySettings


class _HeadTooLarge(Exception):
    """Raised inside a parser callback: httptools turns it into a parse error."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with header size, header count and read-time limits."""

    limits: GatewaySettings  # set on the subclass ``protocol_for`` makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._head_fields = 0
        self._head_too_large = False
        #: The head's or the body's read time limit, whichever is running.
        self._read_deadline = Deadline(self.loop, self._read_timed_out)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn writes a response's head and each body message as it comes: corked, a
        # whole answer leaves in one send instead of two (flow control still reads the
        # real transport, which uvicorn's FlowControl was given above).
        self.transport = CorkedTransport(transport, self.loop)  # type: ignore[assignment]
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._read_deadline.cancel()
        super().connection_lost(exc)
        # uvicorn marks the request whose response is unfinished (a pipelined request
        # behind it waits unread, as in uvicorn); its hang-up notice wakes its watcher.
        cycle = self.cycle
        if cycle is not None and cycle.disconnected:
            hang_up = cycle.scope.get(HANG_UP)
            if isinstance(hang_up, HangUp):
                hang_up.fire()

    def eof_received(self) -> None:
        # The client half-closed: the transport closes itself once this returns, past the
        # corked transport, so what waits in it must go first (it would be dropped).
        if isinstance(self.transport, CorkedTransport):
            self.transport.flush()
        super().eof_received()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._head_fields = 0
        self._arm(self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._count(len(url), fields=0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value), fields=1)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._arm(self.limits.body_timeout_s)
        self.scope[HANG_UP] = HangUp()  # type: ignore[literal-required]
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request's head must arrive in time too (uvicorn's keep-alive timeout
        # covers only an idle connection, not one trickling a head).
        if not self.transport.is_closing():
            self._arm(self.limits.header_timeout_s)

    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        limit = self.limits.max_header_bytes
        body = json.dumps(
            error_body(
                f"request headers exceed {limit} bytes or {self.limits.max_headers} fields",
                "invalid_request_error",
                None,
                "request_header_fields_too_large",
            )
        ).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.transport.close()

    def _count(self, size: int, fields: int) -> None:
        self._head_bytes += size
        self._head_fields += fields
        if (
            self._head_bytes > self.limits.max_header_bytes
            or self._head_fields > self.limits.max_headers
        ):
            self._head_too_large = True
            raise _HeadTooLarge()

    def _arm(self, seconds: float) -> None:
        self._read_deadline.set(seconds)

    def _disarm(self) -> None:
        self._read_deadline.clear()

    def _read_timed_out(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


class CorkedTransport:
    """A connection's transport whose writes of one event-loop iteration go out together,
    in one send at the end of it: a response's head and body, or the events of a stream
    that arrived together. A write waits for at most the rest of the iteration it was
    made in; ``close`` and ``write_eof`` send what is waiting first, ``abort`` drops it,
    and the write buffer's size counts it. Flow control (``pause_writing``) follows the
    real transport's buffer, so it sees a write one iteration late: a stream whose client
    reads nothing can queue one more iteration's events (at most the upstream's read
    buffer, rewritten) before its relay waits."""

    __slots__ = ("_loop", "_transport", "_waiting")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._waiting: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._waiting:
            self._loop.call_soon(self.flush)
        self._waiting.append(data)

    def writelines(self, data: Iterable[bytes]) -> None:
        for part in data:
            self.write(part)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._waiting))

    def flush(self) -> None:
        """Send what waits now."""
        waiting, self._waiting = self._waiting, []
        if waiting and not self._transport.is_closing():
            self._transport.write(waiting[0] if len(waiting) == 1 else b"".join(waiting))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._waiting = []
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol_for(settings: GatewaySettings) -> type[LimitedHttpProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``settings``."""
    return type("GatewayHttpProtocol", (LimitedHttpProtocol,), {"limits": settings})
