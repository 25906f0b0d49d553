"""Serving the gateway app: two listeners, and limits on what a client may send.

- The public listener (``port``) serves the OpenAI API and the health probes; the internal
  listener (``internal_port``) serves ``/metrics`` and ``/admin/``, and the probes. One app
  serves both sockets; ``ListenerGuard`` (gateway/middleware.py) answers 404 for a route on
  the wrong listener, so a network policy can expose one port and keep the other private.
- HTTP/1.1 parsing (httptools) with limits uvicorn does not have: the request line and
  headers together at most ``max_header_bytes`` and ``max_headers`` fields (else 431), the
  whole head within ``header_timeout_s`` of the connection's first byte or of the previous
  response (slow-loris clients are dropped), and the whole body within ``body_timeout_s``
  of the head (then the connection is closed; the app sees the client gone).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import error_body
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
        self._read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol_for(settings: GatewaySettings) -> type[LimitedHttpProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``settings``."""
    return type("GatewayHttpProtocol", (LimitedHttpProtocol,), {"limits": settings})


def server_config(app: Any, settings: GatewaySettings, **overrides: Any) -> uvicorn.Config:
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "access_log": False,
        "timeout_graceful_shutdown": settings.shutdown_grace_s,
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": protocol_for(settings),
        # Never build a URL from the client's Host header: no proxy headers trusted here.
        "proxy_headers": False,
        "server_header": False,
    }
    return uvicorn.Config(app, **{**options, **overrides})


def bind_listeners(settings: GatewaySettings) -> list[socket.socket]:
    """The public socket, then the internal one."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    return [
        socket.create_server((settings.host, port), family=family, backlog=2048)
        for port in (settings.port, settings.internal_port)
    ]


def serve(app: Any, settings: GatewaySettings) -> None:
    """Run ``app`` on both listeners until SIGTERM/SIGINT."""
    uvicorn.Server(server_config(app, settings)).run(sockets=bind_listeners(settings))
