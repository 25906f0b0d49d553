"""The tests' gateway server binds new ports when one it was given is taken by then (a
port ``free_port`` picked is free only until another socket takes it)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import httpx

from tests.support.gateway import GatewayServer


def test_a_gateway_whose_port_was_taken_binds_new_ones(
    start_gateway: Callable[..., GatewayServer],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway = start_gateway(port=port)
        assert gateway.settings.port != port
        assert gateway.url == f"http://127.0.0.1:{gateway.settings.port}"
        assert httpx.get(f"{gateway.url}/healthz", timeout=10).json() == {"status": "ok"}
