"""Serving the gateway app on its two listeners, through uvicorn.

The public listener (``port``) serves the OpenAI API and the health probes; the internal
listener (``internal_port``) serves ``/metrics`` and ``/admin/``, and the probes. One app
serves both sockets; ``ListenerGuard`` (gateway/server/middleware.py) answers 404 for a
route on the wrong listener, so a network policy can expose one port and keep the other
private. Each connection is served by ``http11.HttpProtocol``, the gateway's own HTTP/1.1
protocol (httptools), with limits on what a client may send; uvicorn runs the process.
"""

from __future__ import annotations

import importlib.util
import socket
from typing import Any

import uvicorn

from gateway.server.http11 import protocol_for
from gateway.settings import GatewaySettings


def server_config(app: Any, settings: GatewaySettings, **overrides: Any) -> uvicorn.Config:
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "access_log": False,
        "timeout_graceful_shutdown": settings.shutdown_grace_s,
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": protocol_for(settings),
        "ws": "none",
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
