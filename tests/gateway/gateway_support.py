"""Helpers for the gateway tests: a threaded real gateway, keys in Redis, killable forwarders."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from billing.accounts import BillingAccounts
from billing.meter import (
    Admission,
    AdmissionRefused,
    AdmissionRequest,
    Meter,
    UnmeteredMeter,
    UsageReport,
)
from billing.reporting import UsageReader
from gateway.access.keys import KeyStore
from gateway.app import create_app
from gateway.server.listeners import bind_listeners, server_config
from gateway.settings import GatewaySettings
from serving.process import free_port

ADMIN_TOKEN = "test-admin-token"
#: A function tool the tiny model can be asked to call (tool-call tests).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FORWARDER = Path(__file__).with_name("forwarder.py")


class GatewayServer:
    """A gateway app served on free ports in a background thread, as `cstack gateway`
    serves it (gateway/server/listeners.py): ``url`` is the public listener, ``internal_url`` the
    one with /metrics and /admin/."""

    def __init__(
        self,
        settings: GatewaySettings,
        meter: Meter,
        usage: UsageReader,
        accounts: BillingAccounts | None = None,
    ) -> None:
        if settings.internal_port == GatewaySettings.model_fields["internal_port"].default:
            settings = settings.model_copy(update={"internal_port": free_port()})
        self.settings = settings
        self.app = create_app(settings, meter, usage, accounts=accounts)
        config = server_config(
            self.app, settings, host="127.0.0.1", log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        sockets = bind_listeners(settings.model_copy(update={"host": "127.0.0.1"}))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": sockets}, daemon=True
        )
        self.url = f"http://127.0.0.1:{settings.port}"
        self.internal_url = f"http://127.0.0.1:{settings.internal_port}"

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

    def __init__(
        self,
        target_url: str,
        *,
        overloaded: bool = False,
        hang: bool = False,
        stall_after: int | None = None,
    ) -> None:
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
                *(["--overloaded"] if overloaded else []),
                *(["--hang"] if hang else []),
                *(["--stall-after", str(stall_after)] if stall_after is not None else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def wait_stalled(self) -> None:
        """Until a forwarder made with ``stall_after`` has relayed its bytes and stalled."""
        assert self.process.stdout is not None
        while (line := self.process.stdout.readline()) and line.strip() != "stalled":
            pass
        assert line, "the forwarder ended before it stalled"

    def unread_by_clients(self) -> int:
        """Bytes this forwarder sent that its clients' processes have not read yet: the
        receive queues of this machine's TCP sockets connected to its port."""
        unread = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as rows:
                for row in list(rows)[1:]:
                    fields = row.split()
                    if int(fields[2].rsplit(":", 1)[1], 16) == self.port:
                        unread += int(fields[4].split(":")[1], 16)
        return unread

    def kill(self) -> None:
        self.process.kill()
        # Generous: a loaded CI machine has been seen to take over 10 s to reap it.
        self.process.wait(timeout=60)


class RecordingMeter(UnmeteredMeter):
    """A billing meter that admits everything and keeps what the gateway reported."""

    def __init__(self, refuse: AdmissionRefused | None = None) -> None:
        self.refuse = refuse
        self.admitted: list[AdmissionRequest] = []
        self.settled: list[UsageReport] = []

    def admit_ready(self, request: AdmissionRequest) -> Admission | None:
        return None  # every request through ``admit``, recorded

    async def admit(self, request: AdmissionRequest) -> Admission:
        if self.refuse is not None:
            raise self.refuse
        self.admitted.append(request)
        return Admission(request=request, headers={"x-ratelimit-remaining-requests": "99"})

    async def settle(self, admission: Admission, usage: UsageReport) -> None:
        self.settled.append(usage)

    def settle_nowait(self, admission: Admission, usage: UsageReport) -> None:
        self.settled.append(usage)

    def wait_settled(self, count: int, timeout_s: float = 30) -> list[UsageReport]:
        deadline = time.monotonic() + timeout_s
        while len(self.settled) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.settled)


def metric_value(metrics_text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
