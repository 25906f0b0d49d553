"""The gateway as the tests run it: a real gateway app on real sockets in a thread, keys in
Redis, `cstack keys` in-process, a meter that records what it was told, metric reading."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
from collections.abc import Iterator

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from typer.testing import CliRunner, Result

from billing.contract import (
    Admission,
    AdmissionRefused,
    AdmissionRequest,
    BillingAccounts,
    Meter,
    UnmeteredMeter,
    UsageReader,
    UsageReport,
)
from gateway.access.keys import KeyStore
from gateway.app import create_app
from gateway.server.listeners import bind_listeners, server_config
from gateway.settings import GatewaySettings
from serving.process import free_port
from tests.support.waits import wait_until

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
        sockets, settings = _bind(settings)
        self.settings = settings
        self.app = create_app(settings, meter, usage, accounts=accounts)
        config = server_config(
            self.app, settings, host="127.0.0.1", log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": sockets}, daemon=True
        )
        self.url = f"http://127.0.0.1:{settings.port}"
        self.internal_url = f"http://127.0.0.1:{settings.internal_port}"

    def start(self) -> GatewayServer:
        self.thread.start()

        def started() -> bool:
            assert self.thread.is_alive(), "the gateway's thread ended before it started"
            return bool(self.server.started)

        wait_until(started, "the gateway to start", timeout_s=30, interval_s=0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def _bind(settings: GatewaySettings) -> tuple[list[socket.socket], GatewaySettings]:
    """The gateway's listeners bound first, before its app is made (with the ports it is
    made for). A port ``free_port`` picked stays free only until another socket takes it,
    and any client's connection may be given it as its own port: then new ones are picked
    (CI once lost a run to it: "Address already in use")."""
    for _ in range(5):
        try:
            return bind_listeners(settings.model_copy(update={"host": "127.0.0.1"})), settings
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            settings = settings.model_copy(
                update={"port": free_port(), "internal_port": free_port()}
            )
    raise RuntimeError("no two free ports for the gateway's listeners after 5 tries")


def cstack_keys(redis_url: str, *args: str) -> Result:
    """`cstack keys ...` run in-process (the real command, without a 2-core import tax)."""
    # Imported here: the whole CLI is a heavy import most users of this module never need.
    from deploy.cli import app as cli_app

    return CliRunner().invoke(cli_app, ["keys", *args], env={"CSTACK_REDIS_URL": redis_url})


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
        wait_until(lambda: len(self.settled) >= count, f"{count} settlements", timeout_s)
        return list(self.settled)


def metric_value(metrics_text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def slot_holding_body(model: str = "composer-2.5-fast") -> dict[str, object]:
    """A streamed completion long enough to hold its engine slot for as long as a test needs."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 1500,
        "stream": True,
        "ignore_eos": True,
    }


@contextlib.contextmanager
def held_stream(client: httpx.Client, model: str = "composer-2.5-fast") -> Iterator[httpx.Response]:
    """A stream whose response head has arrived: behind a stalled upstream it holds its
    engine slot until the block ends."""
    with client.stream("POST", "/v1/chat/completions", json=slot_holding_body(model)) as response:
        assert response.status_code == 200, response.read()
        yield response
