"""A client that hangs up on a non-streaming request pays for the tokens vLLM generated for
it: through a real gateway process with billing's real Meter, the usage stream and the
ledger, in front of the session's vLLM."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.settings import BillingSettings
from gateway.api.shaping import UNSTREAMED_STREAM_INTERVAL as CHUNK
from serving.process import free_port
from tests.support.billing import create_org_key, port_open, usage_backlog
from tests.support.gateway_processes import gateway_processes
from tests.support.waits import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]
FORWARDER = Path(__file__).parents[1] / "support" / "fakes" / "forwarder.py"
ENDLESS = {"model": "composer-2.5", "messages": [{"role": "user", "content": "A long story."}],
           "max_tokens": 1500, "ignore_eos": True}  # fmt: skip


@pytest.fixture
def stalling_vllm(vllm_url: str) -> Iterator[str]:
    """vLLM behind a forwarder that holds its streams after ~60 events: the request is
    still unfinished when the client hangs up, however fast this vLLM generates."""
    port = free_port()
    target = vllm_url.removeprefix("http://").split(":")
    command = [sys.executable, str(FORWARDER), str(port), *target, "--stall-after", "20000"]
    forwarder = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: port_open(port), "the forwarder to listen", 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        forwarder.kill()
        forwarder.wait(timeout=10)


def vllm_counter(vllm_url: str, name: str) -> float:
    text = httpx.get(f"{vllm_url}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


async def test_hanging_up_on_a_non_streaming_request_bills_its_tokens_in_the_ledger(
    billing_settings: BillingSettings, vllm_url: str, stalling_vllm: str, tmp_path: Path
) -> None:
    token, _ = await create_org_key(billing_settings.redis_url, "org-hangup", "metered")
    values = billing_settings.model_dump()
    with gateway_processes(values, stalling_vllm, tmp_path, count=1) as (gateway,):
        idle = lambda: vllm_counter(vllm_url, "vllm:num_requests_running") == 0  # noqa: E731
        wait_until(idle, "vLLM to finish earlier tests' requests")
        before = vllm_counter(vllm_url, "vllm:generation_tokens_total")
        body = json.dumps(ENDLESS).encode()
        client = socket.create_connection(("127.0.0.1", int(gateway.rsplit(":", 1)[1])))
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
            b"content-type: application/json\r\nauthorization: Bearer %s\r\n"
            b"content-length: %d\r\n\r\n%s" % (token.encode(), len(body), body)
        )
        generated = lambda: vllm_counter(vllm_url, "vllm:generation_tokens_total")  # noqa: E731
        # An answer asked for whole comes 16 tokens a chunk after its first: three chunks.
        wait_until(lambda: generated() > before + 2 * CHUNK + 8, "vLLM to generate")
        client.close()  # nothing of the answer was sent: it was still being generated

        sync = redis.Redis.from_url(billing_settings.redis_url)
        wait_until(lambda: usage_backlog(sync, billing_settings) == 1, "the usage event")
    engine = make_engine(billing_settings.ledger_url)
    migrate(engine)
    UsageStreamConsumer(sync, engine, billing_settings).drain(max_seconds=30)
    with engine.connect() as connection:
        (row,) = connection.execute(
            select(UsageRow.outcome, UsageRow.completion_tokens, UsageRow.list_cost_nano_usd)
        ).all()
    assert row.outcome == "client_disconnect"
    assert CHUNK + 1 <= row.completion_tokens < 1500
    assert row.list_cost_nano_usd >= row.completion_tokens * 15_000  # fast tier's output price
