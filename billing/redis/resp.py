"""One pipelined Redis connection for the meter's per-request scripts.

Every metered request runs two scripts. Through redis-py's asyncio client each call costs
a stream write and drain, and a stream read under a timeout of its own for every reply:
about a tenth of the gateway's CPU per request. Here commands are queued as they come and
written together once per turn of the event loop, and replies are parsed as they arrive
(hiredis) and handed to their callers in order: one future per command, no task, no
timeout object per call. A connection that makes no progress on its replies for
``timeout_s`` is dropped.

Connecting follows the same URL as the rest of the product (``redis://``, ``rediss://``
with the TLS options of ``TLS_OPTIONS``, others refused rather than ignored, ``unix://``;
user, password and db), and its errors are redis-py's: ``ConnectionError`` for a refused,
dropped or reset connection, ``TimeoutError`` for a connect timeout ("Timeout connecting
...") or replies that stopped coming ("Timeout reading ...", also while authenticating: a
Redis that accepted the connection is there, only slow). An error reply is returned to
its caller as redis-py's exception for it, not raised: one command's failure is not the
connection's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any, cast

import hiredis
from redis import exceptions as redis_errors
from redis._parsers.base import BaseParser
from redis.asyncio.connection import SSLConnection, parse_url

Arg = str | bytes | int


def command(*parts: Arg) -> bytes:
    """A command in RESP, packed by hiredis in C (redis-py's general encoder, and one
    written in Python, cost 2-3x as much: this runs for every script call)."""
    # hiredis's stubs type the tuple as having one element; any number is packed.
    return hiredis.pack_command(cast(Any, parts))


class _Protocol(asyncio.Protocol):
    def __init__(self, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout_s = timeout_s
        self._parser = hiredis.Reader(replyError=redis_errors.ResponseError)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._outgoing: list[bytes] = []
        #: Commands written and not yet answered, and whether a write is due this turn.
        self._unanswered = 0
        self._write_due = False
        self._transport: asyncio.Transport | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        #: Loop time of the last reply (or of the first request waiting since none was).
        self._progress = 0.0
        self.error: Exception | None = None
        self.writes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def on_running_loop(self) -> bool:
        """False once used from another event loop than the one it was made on.

        Asked on every call, so not by ``asyncio.get_running_loop()``, which makes a
        ``getpid`` system call each time (10-15 us on these machines). A connection is used
        from one thread, where one loop runs at a time: if its own loop runs, the caller is
        on it."""
        return self._loop.is_running()

    def request(self, data: bytes) -> asyncio.Future[Any]:
        if self.error is not None:
            raise self.error
        reply: asyncio.Future[Any] = self._loop.create_future()
        if not self._waiting:  # the stall clock starts when a reply is first waited for
            self._progress = self._loop.time()
        self._waiting.append(reply)
        self._outgoing.append(data)
        # One write in flight at a time: what comes while Redis has not answered goes
        # together once it has (at most one round trip later), so a busy gateway, and the
        # Redis it shares, make one write and one read for many commands, not one each.
        if not self._unanswered and not self._write_due:
            self._write_due = True
            self._loop.call_soon(self._write)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self._timeout_s, self._check_progress)
        return reply

    def _write(self) -> None:
        self._write_due = False
        if not self._outgoing:
            return
        if self._transport is not None and self.error is None:
            self._transport.write(b"".join(self._outgoing))
            self.writes += 1
        self._unanswered += len(self._outgoing)
        self._outgoing.clear()

    async def drain(self) -> None:
        await asyncio.gather(*self._waiting, return_exceptions=True)

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        try:
            while (reply := self._parser.gets()) is not False:
                if isinstance(reply, redis_errors.ResponseError):
                    # redis-py's classes: LOADING, NOAUTH, "max number of clients" are
                    # ConnectionErrors (Redis is not there for us), READONLY, OOM, ...
                    reply = BaseParser.parse_error(str(reply))
                if not self._unanswered:
                    raise IndexError  # a reply to a command not written
                self._unanswered -= 1
                waiter = self._waiting.popleft()
                if not waiter.done():
                    waiter.set_result(reply)
        except (hiredis.ProtocolError, IndexError):  # not Redis, or a reply nobody asked for
            self._fail(redis_errors.ConnectionError("Redis sent an unreadable reply"))
            return
        if not self._unanswered and self._outgoing and not self._write_due:
            self._write()  # what came meanwhile, together
        # Noted, not a timer re-armed: a timer made and cancelled per reply costs more.
        self._progress = self._loop.time()

    def _check_progress(self) -> None:
        """The watchdog: fails the connection once replies are awaited and none has come
        for ``timeout_s``; otherwise it looks again when that would be."""
        self._watchdog = None
        if not self._waiting:  # (a failed connection's watchdog was cancelled)
            return
        quiet_s = self._loop.time() - self._progress
        if quiet_s >= self._timeout_s:
            self._fail(redis_errors.TimeoutError("Timeout reading from Redis"))
        else:
            self._watchdog = self._loop.call_later(self._timeout_s - quiet_s, self._check_progress)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self._fail(redis_errors.ConnectionError(f"Connection closed by Redis{reason}"))

    def _fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)
        if self._transport is not None:
            self._transport.abort()
            self._transport = None

    def close(self) -> None:
        self._fail(redis_errors.ConnectionError("Connection closed"))


class RespConnection:
    """``await request(command(...))``: the reply; (re)connects on first use after a failure."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self._options: dict[str, Any] = dict(parse_url(url))
        unsupported = sorted(
            key for key in self._options if key.startswith("ssl") and key not in TLS_OPTIONS
        )
        if unsupported:
            raise ValueError(
                f"the Redis URL's {', '.join(unsupported)} is not supported by the meter's "
                f"connection (supported: {', '.join(sorted(TLS_OPTIONS))})"
            )
        self._timeout_s = timeout_s
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None
        self._closed = False
        #: Commands sent on every new connection after authenticating (e.g. SCRIPT LOAD).
        self.on_connect: list[bytes] = []

    async def request(self, data: bytes) -> Any:
        protocol = self._usable() or await self._connect()
        return await protocol.request(data)

    async def request_all(self, commands: list[bytes]) -> list[Any]:
        """The replies of ``commands``, written together in this order with nothing
        between them (ASKING must come right before the command it is for)."""
        protocol = self._usable() or await self._connect()
        return list(await asyncio.gather(*[protocol.request(data) for data in commands]))

    def _usable(self) -> _Protocol | None:
        """The connection, if it can take a command now (else one must be made). Not a
        coroutine: it is asked on every call."""
        protocol = self._protocol
        if protocol is None or protocol.error is not None or not protocol.on_running_loop():
            return None
        return protocol

    async def _connect(self) -> _Protocol:
        if self._closed:
            raise redis_errors.ConnectionError("the meter's Redis connection is closed")
        # One attempt at a time, shared: its callers all go on together once it is made.
        connecting = self._connecting
        if connecting is None or connecting.done() or not _on_running_loop(connecting):
            connecting = asyncio.get_running_loop().create_task(self._make_connection())
            self._connecting = connecting
        return await asyncio.shield(connecting)

    async def _make_connection(self) -> _Protocol:
        options = self._options
        where = options.get("path") or f"{options.get('host')}:{options.get('port', 6379)}"
        try:
            async with asyncio.timeout(self._timeout_s):
                protocol = await self._open()
        except TimeoutError:
            raise redis_errors.TimeoutError(f"Timeout connecting to {where}") from None
        except OSError as exc:
            raise redis_errors.ConnectionError(f"Error connecting to {where}: {exc}") from None
        try:
            # Under the reply watchdog: a stall here is "Timeout reading" (Redis is up).
            await self._handshake(protocol)
        except BaseException:
            protocol.close()
            raise
        self._protocol = protocol
        return protocol

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        options = self._options

        def factory() -> _Protocol:
            return _Protocol(self._timeout_s)

        if "path" in options:
            _, protocol = await loop.create_unix_connection(factory, str(options["path"]))
            return protocol
        host = str(options.get("host", "localhost"))
        tls = _tls_context(options) if options.get("connection_class") is SSLConnection else None
        _, protocol = await loop.create_connection(
            factory, host, int(options.get("port", 6379)), ssl=tls
        )
        return protocol

    async def _handshake(self, protocol: _Protocol) -> None:
        options = self._options
        password, username = options.get("password"), options.get("username")
        steps = []
        if password is not None:
            auth = (username, password) if username else (password,)
            steps.append(command(b"AUTH", *auth))
        if options.get("db"):
            steps.append(command(b"SELECT", int(options["db"])))
        for step in steps:
            reply = await protocol.request(step)
            if isinstance(reply, redis_errors.ConnectionError):  # wrong password, loading
                raise reply
            if isinstance(reply, redis_errors.RedisError):
                raise redis_errors.AuthenticationError(str(reply))
        for step in self.on_connect:
            reply = await protocol.request(step)
            if isinstance(reply, redis_errors.RedisError):
                raise reply

    @property
    def writes(self) -> int:
        """Writes to the current connection so far: commands made in one turn of the
        event loop go in one."""
        return self._protocol.writes if self._protocol is not None else 0

    async def aclose(self) -> None:
        """Wait for the replies still due, then close; later requests fail at once."""
        self._closed = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self._protocol is not None:
            await self._protocol.drain()
            self._protocol.close()
            self._protocol = None


def _on_running_loop(task: asyncio.Task[Any]) -> bool:
    return task.get_loop() is asyncio.get_running_loop()


#: The TLS options of a ``rediss://`` URL this connection applies (others are refused).
TLS_OPTIONS = frozenset(
    {"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    if options.get("ssl_certfile"):
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    if str(options.get("ssl_check_hostname", "true")).lower() in ("false", "0", "no"):
        context.check_hostname = False
    requirement = str(options.get("ssl_cert_reqs", "required")).lower()
    if requirement == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif requirement == "optional":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_OPTIONAL
    return context
