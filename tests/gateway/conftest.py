"""Gateway fixtures: real gateways on real sockets (uvicorn in a thread), real Redis keys,
and killable forwarding processes that stand in for extra upstream replicas."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from billing.contract import (
    BillingAccounts,
    Meter,
    UnmeteredMeter,
    UnmeteredUsageReader,
    UsageReader,
)
from gateway.settings import GatewaySettings
from serving.process import free_port
from serving.settings import DEFAULT_VARIANTS_FILE
from tests.support.fakes.replica import Forwarder
from tests.support.gateway import ADMIN_TOKEN, GatewayServer, RecordingMeter, create_key


@pytest.fixture(scope="session")
def start_gateway(redis_url: str) -> Iterator[Callable[..., GatewayServer]]:
    """Start a gateway with settings overrides; all are stopped at the end of the session."""
    servers: list[GatewayServer] = []

    def start(
        meter: Meter | None = None,
        usage: UsageReader | None = None,
        accounts: BillingAccounts | None = None,
        **overrides: Any,
    ) -> GatewayServer:
        values: dict[str, Any] = {
            "port": free_port(),
            "redis_url": redis_url,
            "admin_token": ADMIN_TOKEN,
            "health_interval_s": 0.5,
            **overrides,
        }
        server = GatewayServer(
            GatewaySettings(**values),
            meter or UnmeteredMeter(),
            usage or UnmeteredUsageReader(),
            accounts,
        ).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def gateway(start_gateway: Callable[..., GatewayServer], vllm_url: str) -> GatewayServer:
    """The shared gateway in front of the session's vLLM (both tiers on one engine)."""
    return start_gateway(upstream_url=vllm_url)


@pytest.fixture(scope="module")
def recorded(
    start_gateway: Callable[..., GatewayServer], vllm_url: str
) -> tuple[GatewayServer, RecordingMeter]:
    """A gateway of this module's own in front of vLLM, and the meter that records what it
    admitted and settled."""
    meter = RecordingMeter()
    return start_gateway(meter=meter, upstream_url=vllm_url), meter


@pytest.fixture(scope="module")
def client(recorded: tuple[GatewayServer, RecordingMeter], api_key: str) -> openai.OpenAI:
    """The openai SDK on ``recorded``'s gateway (a module may define its own ``client``)."""
    gateway, _ = recorded
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)


@pytest.fixture(scope="session")
def api_key(redis_url: str) -> str:
    return create_key(redis_url, "acme")[0]


@pytest.fixture
def forwarders(vllm_url: str) -> Iterator[Callable[..., Forwarder]]:
    started: list[Forwarder] = []

    def start(
        *, overloaded: bool = False, hang: bool = False, stall_after: int | None = None
    ) -> Forwarder:
        forwarder = Forwarder(vllm_url, overloaded=overloaded, hang=hang, stall_after=stall_after)
        started.append(forwarder)
        return forwarder

    yield start
    for forwarder in started:
        if forwarder.process.poll() is None:
            forwarder.kill()


@pytest.fixture
def stalled_gateway(
    start_gateway: Callable[..., GatewayServer],
    forwarders: Callable[..., Forwarder],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., GatewayServer]:
    """A gateway with the cpu profile's engine slots (8 on the shared engine, 6 of them for
    standard) in front of real vLLM through an upstream that stalls each stream after its
    head, so a stream holds its slot until its client closes it (``held_stream``). Keyword
    arguments override ``slot_sharing`` in the variants."""

    def start(**slot_sharing: Any) -> GatewayServer:
        if slot_sharing:
            raw = yaml.safe_load(DEFAULT_VARIANTS_FILE.read_text())
            raw["slot_sharing"].update(slot_sharing)
            variants = tmp_path / "variants.yaml"
            variants.write_text(yaml.safe_dump(raw))
            monkeypatch.setenv("CSTACK_VARIANTS_FILE", str(variants))
        monkeypatch.setenv("CSTACK_SERVING_PROFILE", "cpu")
        return start_gateway(upstream_url=forwarders(stall_after=2000).url)

    return start
