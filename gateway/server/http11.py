"""The gateway's HTTP/1.1 server protocol: httptools' parser (llhttp) under an ASGI app.

uvicorn still runs the process (listeners, signals, lifespan, graceful shutdown); each
connection is this protocol, given to uvicorn as its ``http`` class. Serving a trivial
app it costs 14 us a request where uvicorn's httptools protocol with the gateway's limits
cost 20 (the 2-core machines here). It does only what the gateway needs:

- limits uvicorn does not have: the request line and headers together at most
  ``max_header_bytes`` and ``max_headers`` fields (else 431, OpenAI's error body; a
  header that never ends is counted by the reads it spans); the head within
  ``header_timeout_s`` of the connection's opening and of the head's first byte
  (slow-loris clients are dropped), the body within ``body_timeout_s`` of the head; an
  idle kept-alive connection closed after uvicorn's ``timeout_keep_alive``;
- corked writes: what one event-loop iteration writes leaves in one send at its end (an
  unstreamed answer's head and body, a stream's events of one upstream read). Sending
  the last part of an answer at once instead cost more CPU a request, not less (the
  kernel's, measured with the gateway saturated);
- the hang-up notice (``gateway.server.hang_up``) in each request's scope, fired for the
  running request and any pipelined behind it when the connection is lost;
- pipelining (a request is answered once the one before it is; reading pauses with
  ``PIPELINE_DEPTH`` requests queued, and stops at ``PIPELINE_LIMIT``: those are answered,
  then the connection closes), ``Expect: 100-continue`` (answered without asking for the
  body: the connection closes after it), HEAD, 204 and 304 (their bodies dropped),
  HTTP/1.0 (closed after its answer), flow control both ways (a client that reads
  nothing pauses the app's writes; a body the app has not read pauses reading);
- a client that takes nothing for ``send_timeout_s`` while the transport's buffer is
  full, or while a closing (or half-closed) connection still has bytes to send, is cut
  off (the connection aborted, its requests' hang-ups fired): else it would hold its
  buffer, and a request waiting to write, for as long as it likes. What it takes is
  counted from the kernel's send queue, which falls as the client acknowledges: a
  steady reader is cut only below about one window update (about 100 KB) a period,
  2 KiB/s at the default 60 s; one that reads nothing goes within two periods (its
  kernel takes a last window's worth once the first starts);
- a body the app answered without reading is skipped as it arrives, then the next
  request read; a chunked body's trailers are dropped (never request headers);
- no upgrades: a request asking for one (WebSocket, h2c) is answered as plain HTTP and
  its connection closed after it.

A response's headers come from the gateway's own code; one holding a CR or LF (a split
response) is refused, and the app gets the error (uvicorn refuses it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import struct
import termios
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools

from gateway.deadlines import Deadline
from gateway.server.hang_up import HANG_UP, HangUp
from gateway.server.request_cycle import RequestCycle, error_response
from gateway.settings import GatewaySettings

#: Linux's SIOCOUTQ: a socket's bytes not yet sent or acknowledged (TIOCOUTQ's number).
_OUTQ = termios.TIOCOUTQ
#: A body the app has not read yet pauses reading the socket past this many bytes.
BODY_HIGH_WATER = 64 * 1024
#: Requests pipelined behind the one being answered that pause reading the socket. The
#: socket is read until then, so that a client who hangs up is noticed (a paused socket
#: is not watched, not even for its end).
PIPELINE_DEPTH = 4
#: Requests queued behind the one being answered past which the connection reads no more:
#: those queued are answered, then it closes (one read can hold thousands of small
#: requests, all parsed before a pause takes effect).
PIPELINE_LIMIT = 32


class _HeadTooLarge(Exception):
    """Raised inside a parser callback: httptools turns it into a parse error."""


class _TooManyQueued(Exception):
    """Raised inside a parser callback to stop parsing a flood of pipelined requests."""


class HttpProtocol(asyncio.Protocol):
    """One client connection. Made by uvicorn's server as its ``http`` protocol class
    (``protocol_for`` binds the limits)."""

    limits: GatewaySettings  # set on the subclass ``protocol_for`` makes

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.app_state = app_state
        self.keep_alive_s: float = config.timeout_keep_alive
        self.asgi = {"version": config.asgi_version, "spec_version": "2.3"}
        self.root_path: str = config.root_path
        self.parser = httptools.HttpRequestParser(self)
        # Bytes after a request that closes the connection (``Connection: close``, HTTP/1.0)
        # are ignored, not an error that would cut that request's answer.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        #: The request whose head or body is being read, and the one being answered
        #: (the same but when pipelined requests wait in ``pipeline``).
        self.reading: RequestCycle | None = None
        self.answering: RequestCycle | None = None
        self.pipeline: deque[RequestCycle] = deque()
        self.read_deadline = Deadline(self.loop, self._read_timed_out)
        #: Armed while the client takes nothing (made at the first such wait), and what
        #: was queued for the client when it was (``_queued``).
        self.send_deadline: Deadline | None = None
        self._queued_when_armed = 0
        self.read_paused = False
        self.writable: asyncio.Event | None = None  # while the transport's buffer is full
        self.corked: list[bytes] = []
        #: No more is read: an upgrade was asked for, or too many requests were queued.
        self.reading_done = False
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        #: Bytes of the reads that began and ended inside the head: httptools hands over a
        #: header only once it ends, so a value that never ends is counted here.
        self._head_read = 0
        self._head_too_large = False
        self._expect_continue = False
        #: What is being read (0: nothing, 1: a head, 2: a body), and whether its read
        #: deadline is set: set once a read ends inside it, so a request that arrives in
        #: one read sets none.
        self._phase = 0
        self._phase_timed = False

    # --- the connection -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server_state.connections.add(self)
        sockname = transport.get_extra_info("sockname")
        peername = transport.get_extra_info("peername")
        if isinstance(sockname, tuple):
            self.server = (str(sockname[0]), int(sockname[1]))
        if isinstance(peername, tuple):
            self.client = (str(peername[0]), int(peername[1]))
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"
        self.read_deadline.set(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        self.read_deadline.cancel()
        if self.send_deadline is not None:
            self.send_deadline.cancel()
        self.corked = []
        for cycle in (self.answering, self.reading, *self.pipeline):
            if cycle is not None:
                cycle.lost()
        self.pipeline.clear()
        if self.writable is not None:
            self.writable.set()

    def eof_received(self) -> bool | None:
        # The client half-closed: the transport closes itself once this returns, so what
        # is corked goes first (it would be dropped), within ``send_timeout_s`` as close's.
        self.flush()
        if self.transport.get_write_buffer_size():
            self._expect_sending()
        return None

    def data_received(self, data: bytes) -> None:
        if self.reading_done:
            return
        in_head = self._phase == 1
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # The request was dispatched as plain HTTP; what follows its head is another
            # protocol's, never read. Its answer closes the connection.
            self._stop_reading()
            return
        except httptools.HttpParserError:
            if self.reading_done:  # too many queued: answer them, then close
                return
            self._refuse_malformed()
            return
        phase = self._phase
        if phase == 1 and in_head:
            self._head_read += len(data)
            if self._head_read > self.limits.max_header_bytes:
                self._head_too_large = True
                self._refuse_malformed()
                return
        if phase and not self._phase_timed:
            self._phase_timed = True
            limits = self.limits
            self.read_deadline.set(limits.header_timeout_s if phase == 1 else limits.body_timeout_s)

    def _stop_reading(self) -> None:
        """Read no more: the last request read is the connection's last answer."""
        self.reading_done = True
        if self.reading is not None:
            self.reading.keep_alive = False

    def _refuse_malformed(self) -> None:
        if self.answering is not None and not self.answering.complete:
            self.close()  # an answer is on its way: nowhere to put an error
            return
        if self._head_too_large:
            limits = self.limits
            message = (
                f"request headers exceed {limits.max_header_bytes} bytes or "
                f"{limits.max_headers} fields"
            )
            response = error_response(431, message, "request_header_fields_too_large")
        else:
            response = error_response(400, "invalid HTTP request", "invalid_http")
        self.write(response)
        self.close()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close when idle, else after the answer."""
        answering = self.answering
        if answering is None or answering.complete:
            self.close()
        else:
            answering.keep_alive = False

    def pause_writing(self) -> None:
        self.writable = asyncio.Event()
        self._expect_sending()

    def resume_writing(self) -> None:
        if self.send_deadline is not None and not self.transport.is_closing():
            self.send_deadline.clear()
        if self.writable is not None:
            self.writable.set()
            self.writable = None

    def _expect_sending(self) -> None:
        """Cut the client off unless it takes some of what waits within ``send_timeout_s``."""
        if self.send_deadline is None:
            self.send_deadline = Deadline(self.loop, self._send_timed_out)
        self._queued_when_armed = self._queued()
        self.send_deadline.set(self.limits.send_timeout_s)

    def _send_timed_out(self) -> None:
        # Writers wait for ``writable`` and a closing connection writes no more (an error
        # answer written beside them closes the connection anyway): what is queued falls
        # only as the client takes it.
        queued = self._queued()
        if not queued:  # all taken
            return
        if queued < self._queued_when_armed:
            self._expect_sending()
            return
        self.transport.abort()  # connection_lost follows: the hang-ups fire

    def _queued(self) -> int:
        """Bytes the client has yet to take: the transport's buffer and the kernel's send
        queue (``SIOCOUTQ``: not yet sent or not yet acknowledged). The buffer alone moves
        in steps of megabytes over TCP (the kernel asks for more once its queue of up to
        4 MiB has drained by a third): a client reading 20 KiB/s looked idle for 60 s."""
        transport = self.transport
        queued = transport.get_write_buffer_size()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, ValueError):  # not Linux, or not a socket
                queued += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0" * 4))[0]
        return queued

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read on, unless a body waits unread or requests queue up past their bounds."""
        reading = self.reading
        if (
            self.read_paused
            and len(self.pipeline) < PIPELINE_DEPTH
            and (reading is None or reading.body_size <= BODY_HIGH_WATER)
        ):
            self.read_paused = False
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        """Send ``data`` at the end of this event-loop iteration, after what waits."""
        corked = self.corked
        if not corked:
            self.loop.call_soon(self.flush)
        corked.append(data)

    def flush(self) -> None:
        corked, self.corked = self.corked, []
        if corked and not self.transport.is_closing():
            self.transport.write(corked[0] if len(corked) == 1 else b"".join(corked))

    def close(self) -> None:
        """Close the connection once what waits is sent (within ``send_timeout_s``)."""
        self.flush()
        transport = self.transport
        if transport.is_closing():
            return
        transport.close()
        if transport.get_write_buffer_size():
            self._expect_sending()

    def _read_timed_out(self) -> None:
        if not self.transport.is_closing():
            self.close()

    # --- httptools' callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._head_read = 0
        self._expect_continue = False
        self._phase = 1
        self._phase_timed = False
        self.read_deadline.clear()  # an idle connection's: a request has begun

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > self.limits.max_header_bytes:
            self._too_large()
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase != 1:
            return  # a chunked body's trailer: not a request header
        self._head_bytes += len(name) + len(value)
        headers = self._headers
        limits = self.limits
        if self._head_bytes > limits.max_header_bytes or len(headers) >= limits.max_headers:
            self._too_large()
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        headers.append((name, value))

    def _too_large(self) -> None:
        self._head_too_large = True
        raise _HeadTooLarge()

    def on_headers_complete(self) -> None:
        self._phase = 2
        self._phase_timed = False
        parser = self.parser
        version = parser.get_http_version()
        url = httptools.parse_url(self._url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        root_path = self.root_path
        scope = {
            "type": "http",
            "asgi": self.asgi,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": parser.get_method().decode("ascii"),
            "root_path": root_path,
            "path": root_path + path if root_path else path,
            "raw_path": root_path.encode("ascii") + raw_path if root_path else raw_path,
            "query_string": url.query or b"",
            "headers": self._headers,
            "state": self.app_state.copy(),
            HANG_UP: HangUp(),
        }
        keep_alive = version != "1.0" and parser.should_keep_alive()
        cycle = RequestCycle(self, scope, keep_alive, self._expect_continue)
        self.reading = cycle
        if self.answering is None:
            self._answer(cycle)
            return
        self.pipeline.append(cycle)  # pipelined: answered after the one before it
        if len(self.pipeline) >= PIPELINE_DEPTH:
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self.reading
        if cycle is None or cycle.complete:
            return  # answered already without reading it (an early error)
        cycle.body.append(body)
        cycle.body_size += len(body)
        if cycle.body_size > BODY_HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        cycle = self.reading
        if cycle is None:
            return
        cycle.more_body = False
        cycle.wake()
        self._phase = 0
        if cycle.complete and self.answering is None:  # answered before its body was read
            self.read_deadline.set(self.keep_alive_s)
        else:  # the head's or the body's, whichever was set
            self.read_deadline.clear()
        if len(self.pipeline) >= PIPELINE_LIMIT:  # whole, it is the last one answered
            self._stop_reading()
            raise _TooManyQueued()

    # --- answering ------------------------------------------------------------------

    def _answer(self, cycle: RequestCycle) -> None:
        self.answering = cycle
        # In uvicorn's set until it ends (its graceful shutdown waits for them).
        cycle.task = self.loop.create_task(cycle.run(self.app))
        self.server_state.tasks.add(cycle.task)

    def answered(self, cycle: RequestCycle) -> None:
        """``cycle``'s response is complete: on to the next request."""
        self.server_state.total_requests += 1
        self.answering = None
        if self.transport.is_closing():
            return
        if self.pipeline:
            self._answer(self.pipeline.popleft())
            self.resume_reading()
            return
        self.resume_reading()
        if not self._phase:  # else the deadline of what is being read runs
            self.read_deadline.set(self.keep_alive_s)


def protocol_for(settings: GatewaySettings) -> type[HttpProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``settings``."""
    return type("GatewayHttpProtocol", (HttpProtocol,), {"limits": settings})
