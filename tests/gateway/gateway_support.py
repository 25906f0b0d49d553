"""Helpers for the gateway tests: a threaded real gateway, keys in Redis, killable forwarders."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import uvicorn
from redis.asyncio import Redis

from billing.meter import Meter
from gateway import GatewaySettings, KeyStore, create_app

ADMIN_TOKEN = "test-admin-token"
FORWARDER = Path(__file__).with_name("forwarder.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayServer:
    """A gateway app served by uvicorn on a free port in a background thread."""

    def __init__(self, settings: GatewaySettings, meter: Meter) -> None:
        self.settings = settings
        self.app = create_app(settings, meter)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=settings.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{settings.port}"

    def start(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def create_key(redis_url: str, org: str, plan: str = "") -> tuple[str, str]:
    """``(plaintext key, key id)`` for a fresh key of ``org`` (created if missing)."""

    async def run() -> tuple[str, str]:
        redis = Redis.from_url(redis_url)
        try:
            store = KeyStore(redis, "default")
            if await store.get_org(org) is None:
                await store.create_org(org, plan=plan)
            token, record = await store.create_key(org, plan=plan)
            return token, record.key_id
        finally:
            await redis.aclose()  # type: ignore[attr-defined]

    return asyncio.run(run())


class Forwarder:
    """A separate process relaying a port to an upstream; ``kill`` is a hard crash."""

    def __init__(self, target_url: str) -> None:
        target = urlparse(target_url)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(FORWARDER),
                str(self.port),
                target.hostname or "",
                str(target.port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)
