"""A lean pooled HTTP/1.1 client for the gateway's one upstream hop (httptools parser).

The upstream hop is the gateway's hottest code: on these 2-core machines httpx spent
1.2-2.4 ms of CPU per proxied request and aiohttp about 0.4 ms, against a 1 ms budget for
everything the gateway adds (bench/RESULTS.md). This client does only what that hop needs:
keep-alive connections to one origin, a POST written in one ``write``, the response head
awaited, the body read whole or chunk by chunk as it arrives (chunked decoding by
httptools, the parser uvicorn uses), a read timeout between bytes, and ``close`` that
either returns a finished connection to the pool or drops an unfinished one, which is
what tells vLLM to abort the request.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httptools

from gateway.deadlines import Deadline

#: Idle connections older than this are not reused: uvicorn (vLLM's server) closes idle
#: keep-alive connections after 5 s, and a connection it is closing must not be picked.
IDLE_REUSE_S = 4.0


class UpstreamConnectError(Exception):
    """Refused, reset or closed before the response head: safe to send elsewhere."""


class UpstreamReadTimeout(Exception):
    """No byte from the upstream within the read timeout."""


class UpstreamCut(Exception):
    """The connection ended in the middle of a response body."""


#: Body bytes buffered per response before reading from the upstream pauses (it resumes once
#: the reader takes them): a client that reads slowly slows the upstream instead of filling
#: memory.
BUFFER_HIGH_WATER = 256 * 1024


class Response:
    """One upstream response: status known, body still arriving."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.status = 0
        self.head = connection.loop.create_future()
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.error: Exception | None = None
        self._closed = False
        #: Seconds spent waiting for the body's bytes (the upstream's time, not ours).
        self.waited_s = 0.0

    # Called by the connection as bytes arrive: a read's chunks (vLLM sends an HTTP chunk
    # per event) are gathered, and the reader woken once for all of them (``wake``).
    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > BUFFER_HIGH_WATER:
            self._connection.pause_reading()

    def finish(self, error: Exception | None = None) -> None:
        if error is None:
            self.complete = True
        elif self.error is None and not self.complete:
            self.error = error
            if not self.head.done():
                self.head.set_exception(error)
        self.wake()

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ``async for data in response``: the body as it arrives, everything that came since
    # the last step in one piece (one step for all of a read's events spares the relay a
    # step, a split and a write for each). The response is its own iterator, not an async
    # generator: the loop tracks every async generator in a weak set, made and dropped
    # per request.
    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> bytes:
        chunks = self._chunks
        while not chunks:
            if self.complete:
                raise StopAsyncIteration
            if self.error is not None:
                raise self.error
            self._waiter = self._connection.loop.create_future()
            waiting_since = time.perf_counter()
            try:
                await self._waiter
            finally:
                self.waited_s += time.perf_counter() - waiting_since
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._connection.resume_reading()
        return data

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    def close(self) -> None:
        """Back to the pool if the exchange finished cleanly, else drop the connection."""
        if not self._closed:
            self._closed = True
            self._connection.release(reusable=self.complete and self.error is None)


class Connection(asyncio.Protocol):
    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.alive = True
        #: Read when the response completes: httptools answers False once it has reset.
        self.keep_alive = False
        self.idle_since = 0.0
        #: The read timeout: no byte for ``read_timeout_s`` while a response is awaited.
        self._read_deadline = Deadline(self.loop, self._timed_out)
        self._reading_paused = False

    def send(self, request: bytes) -> Response:
        assert self.transport is not None
        self.response = Response(self)
        self.keep_alive = False
        try:
            if not self.alive or self.transport.is_closing():
                raise RuntimeError("the transport is closing")
            self.transport.write(request)
        except RuntimeError:
            # Closed since it was picked (the upstream died and its connection_lost has not
            # run yet): uvloop raises RuntimeError on the write. Nothing was sent, so the
            # request may go elsewhere, as after a refused connection.
            self.alive = False
            self.response.finish(UpstreamConnectError("upstream closed the connection"))
            return self.response
        self._arm_timer()
        return self.response

    def release(self, reusable: bool) -> None:
        self.resume_reading()  # a connection goes back to the pool reading
        self._read_deadline.clear()
        self.response = None
        if reusable and self.alive and self.keep_alive:
            self.pool.put_back(self)
        else:
            self.abort()

    def pause_reading(self) -> None:
        """The reader is behind: stop reading (TCP then slows the upstream). No read
        timeout meanwhile: the wait is the client's; the request's deadline bounds it."""
        if not self._reading_paused and self.transport is not None and self.alive:
            self._reading_paused = True
            self._read_deadline.clear()
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and self.alive:
            self._reading_paused = False
            self._arm_timer()
            self.transport.resume_reading()

    def abort(self) -> None:
        self.alive = False
        self._read_deadline.cancel()
        if self.transport is not None:
            self.transport.abort()
        self.pool.forget(self)

    def _arm_timer(self) -> None:
        self._read_deadline.set(self.pool.read_timeout_s)

    def _timed_out(self) -> None:
        if self.response is not None:
            self.response.finish(UpstreamReadTimeout(f"no byte for {self.pool.read_timeout_s}s"))
        self.abort()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            self.abort()  # bytes nobody asked for: the connection cannot be trusted
            return
        self._arm_timer()
        response = self.response
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response.finish(UpstreamCut(f"malformed upstream response: {exc}"))
            self.abort()
        response.wake()  # for every chunk of the read at once

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self._read_deadline.cancel()
        self.pool.forget(self)
        response = self.response
        if response is not None and not response.complete:
            if response.head.done():
                response.finish(UpstreamCut("upstream closed the connection mid-response"))
            else:
                response.finish(UpstreamConnectError("upstream closed the connection"))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        assert self.response is not None
        self.response.status = self.parser.get_status_code()
        if not self.response.head.done():
            self.response.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response.feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        self._read_deadline.clear()
        self.keep_alive = self.parser.should_keep_alive()
        self.response.finish()


class ConnectionPool:
    """Keep-alive connections to one origin (``http://host:port``), at most ``limit``."""

    def __init__(
        self,
        url: str,
        *,
        limit: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        """``api_key``: sent as ``Authorization: Bearer`` on every request (vLLM's key)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"upstream {url!r}: expected http://host[:port] (no path)")
        self.host, self.port = parts.hostname, parts.port or 80
        self.host_header = parts.netloc.encode()
        if api_key and (not api_key.isprintable() or any(c.isspace() for c in api_key)):
            raise ValueError("upstream API key: printable characters without spaces only")
        # Built once: the head of every request carries it, health checks included.
        self._auth_header = f"authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self.loop = asyncio.get_running_loop()
        self.read_timeout_s = read_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._slots = asyncio.Semaphore(limit)
        #: Connections opened so far: with keep-alive working, about the peak concurrency.
        self.opened = 0

    async def request(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        meanwhile: Callable[[], Awaitable[object]] | None = None,
    ) -> Response:
        """POST and wait for the response head (the body is read from the response).

        ``meanwhile``: the caller's work to do while the upstream works on the request,
        awaited once the request is written and before its head is: what it raises
        abandons the request (its connection is dropped, which aborts it upstream)."""
        head = [
            f"POST {path} HTTP/1.1\r\nhost: ".encode(),
            self.host_header,
            b"\r\n",
            self._auth_header,
        ]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n".encode())
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        return await self._exchange(b"".join(head) + body, meanwhile)

    async def get_status(self, path: str) -> int:
        """A GET whose body is discarded (health checks)."""
        return (await self.get(path))[0]

    async def get(self, path: str) -> tuple[int, bytes]:
        """A GET: status and body."""
        request = b"".join(
            [b"GET ", path.encode(), b" HTTP/1.1\r\nhost: ", self.host_header, b"\r\n",
             self._auth_header, b"\r\n"]
        )  # fmt: skip
        response = await self._exchange(request)
        try:
            return response.status, await response.read()
        finally:
            response.close()

    async def _exchange(
        self, request: bytes, meanwhile: Callable[[], Awaitable[object]] | None = None
    ) -> Response:
        """Send ``request`` (then await ``meanwhile``) and wait for the response head."""
        connection, reused = await self._acquire()
        response = connection.send(request)
        try:
            if meanwhile is not None:
                await meanwhile()
            await response.head
        except UpstreamConnectError:
            response.close()
            if not reused:
                raise
            # A kept-alive connection the server closed just as it was reused: the request
            # never reached the application, so one fresh connection may carry it.
            connection, _ = await self._acquire(fresh=True)
            response = connection.send(request)
            try:
                await response.head
            except BaseException:
                response.close()
                raise
        except BaseException:
            response.close()
            raise
        return response

    async def _acquire(self, fresh: bool = False) -> tuple[Connection, bool]:
        """A connection and whether it was reused from the idle list."""
        now = self.loop.time()
        while self._idle and not fresh:
            connection = self._idle.pop()
            if connection.alive and now - connection.idle_since < IDLE_REUSE_S:
                return connection, True
            connection.abort()
        await self._slots.acquire()
        connection = Connection(self)
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: connection, self.host, self.port),
                self._connect_timeout_s,
            )
        except BaseException as exc:
            # Cancellation too (a health probe's own timeout): a slot lost here is lost for
            # good, and enough of them would block the pool forever.
            self._slots.release()
            if isinstance(exc, (OSError, TimeoutError)):
                raise UpstreamConnectError(f"cannot connect: {type(exc).__name__}") from exc
            raise
        self._open.add(connection)
        self.opened += 1
        return connection, False

    def put_back(self, connection: Connection) -> None:
        if self._slots.locked():
            # Every slot is taken, so a request may be waiting for one: an idle connection
            # would keep its slot from it. Closing frees the slot (only at the limit).
            connection.abort()
            return
        connection.idle_since = self.loop.time()
        self._idle.append(connection)

    def forget(self, connection: Connection) -> None:
        if connection in self._open:
            self._open.discard(connection)
            self._slots.release()

    def close(self) -> None:
        for connection in list(self._open):
            connection.abort()
        self._idle.clear()
