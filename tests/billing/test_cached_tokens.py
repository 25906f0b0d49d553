"""Cached input tokens are real end to end: vLLM (prefix caching and prompt-token details
on, as serving/variants.yaml configures every variant) reports them, the client sees
``usage.prompt_tokens_details.cached_tokens``, and the ledger, ``GET /v1/usage`` and the
invoice carry them at the price book's cached-input price.

vLLM's CPU build disables prefix caching for MLA models, so this test serves the tiny
non-MLA MoE checkpoint (``cstack model build-tiny --architecture qwen3_moe``).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from openai import OpenAI
from sqlalchemy import select

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.ledger.invoice import invoice_preview
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from serving.process import ManagedProcess, free_port
from serving.tiny import build_tiny_checkpoint
from tests.support.billing import REPO, create_org_key, port_open, settings_env, write_test_book
from tests.support.commands import cstack_command
from tests.support.gateway_processes import METERED_GATEWAY
from tests.support.waits import wait_until

pytestmark = pytest.mark.vllm

# Nano-USD per token: standard input $0.50/1M, cached input $0.05/1M, output $2.50/1M.
INPUT, CACHED, OUTPUT = 500, 50, 2500
VERSION = {
    "version": "2026-01-01",
    "effective_from": "2026-01-01T00:00:00Z",
    "tiers": {
        "standard": {
            "input_per_1m": "0.50",
            "cached_input_per_1m": "0.05",
            "output_per_1m": "2.50",
        },
        "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
    },
}
PLAN = {"included_usd": "0.00", "overage": "billed", "overage_budget_usd": "100.00",
        "rpm": 100000, "tpm": 100000000}  # fmt: skip


@pytest.fixture(scope="module")
def caching_vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = build_tiny_checkpoint(
        tmp_path_factory.mktemp("models") / "qwen3-moe", architecture="qwen3_moe"
    )
    port = free_port()
    server = ManagedProcess(
        "cstack serve (qwen3_moe)",
        cstack_command("serve", "--variant", "shared", "--model", str(model), "--port", str(port)),
        log_path=tmp_path_factory.mktemp("logs") / "cstack-serve-qwen.log",
        health_url=f"http://127.0.0.1:{port}/health",
    )
    server.start()
    try:
        server.wait_healthy(timeout_s=900)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def gateway_url(
    caching_vllm_url: str, billing_settings: BillingSettings, tmp_path: Path
) -> Iterator[str]:
    port = free_port()
    values = {
        **billing_settings.model_dump(),
        "port": port,
        "internal_port": free_port(),
        "upstream_url": caching_vllm_url,
    }
    log = (tmp_path / "gateway.log").open("wb")
    process = subprocess.Popen(
        METERED_GATEWAY,
        env=settings_env(values),
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: port_open(port), "the metered gateway to listen", 120)
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200,
            "the gateway's upstream to be healthy",
            120,
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)  # every thread's stack into its log
            time.sleep(1)
            process.kill()
            process.wait(timeout=10)
            raise AssertionError(
                "the gateway did not shut down within 30 s of SIGTERM:\n"
                + (tmp_path / "gateway.log").read_text()[-6000:]
            ) from None
        finally:
            log.close()


@pytest.fixture
def billing_settings(billing_settings: BillingSettings, tmp_path: Path) -> BillingSettings:
    book = write_test_book(tmp_path / "cached-book.yaml", versions=[VERSION], plans={"c": PLAN})
    return billing_settings.model_copy(update={"pricebook_path": book})


def _api_key(redis_url: str) -> str:
    token, _ = asyncio.run(create_org_key(redis_url, "org-cached", "c"))
    return token


def test_cached_input_tokens_are_reported_metered_and_invoiced(
    gateway_url: str, billing_settings: BillingSettings
) -> None:
    token = _api_key(billing_settings.redis_url)
    client = OpenAI(base_url=f"{gateway_url}/v1", api_key=token, max_retries=0)
    # Long enough to fill several KV-cache blocks, so the repeat can hit the prefix cache.
    document = " ".join(
        f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(60)
    )
    answers = [
        client.chat.completions.create(
            model="composer-2.5-standard",
            messages=[{"role": "user", "content": document}],
            max_tokens=4,
        )
        for _ in range(2)
    ]
    client.close()  # an idle kept-alive connection would hold up the gateway's shutdown
    usages = [answer.usage for answer in answers]
    assert all(u is not None and u.prompt_tokens_details is not None for u in usages)
    cached = [u.prompt_tokens_details.cached_tokens or 0 for u in usages]  # type: ignore[union-attr]
    prompt = [u.prompt_tokens for u in usages]  # type: ignore[union-attr]
    output = [u.completion_tokens for u in usages]  # type: ignore[union-attr]
    assert prompt[0] == prompt[1] > 256
    assert 0 < cached[1] < prompt[1], "the repeated prompt was served from the prefix cache"

    engine = make_engine(billing_settings.ledger_url)
    migrate(engine)
    sync = redis.Redis.from_url(billing_settings.redis_url)
    UsageStreamConsumer(sync, engine, billing_settings).drain(max_seconds=30)
    with engine.connect() as connection:
        rows = connection.execute(
            select(UsageRow.cached_tokens, UsageRow.list_cost_nano_usd, UsageRow.started_at)
            .where(UsageRow.org_id == "org-cached")
            .order_by(UsageRow.started_at)
        ).all()
    assert [row.cached_tokens for row in rows] == cached
    expected = [
        (p - c) * INPUT + c * CACHED + o * OUTPUT
        for p, c, o in zip(prompt, cached, output, strict=True)
    ]
    assert [row.list_cost_nano_usd for row in rows] == expected

    usage = httpx.get(
        f"{gateway_url}/v1/usage", headers={"authorization": f"Bearer {token}"}, timeout=30
    ).json()
    assert usage["totals"]["cached_tokens"] == sum(cached)

    period = f"{rows[0].started_at:%Y-%m}"
    preview = invoice_preview(
        engine, load_pricebook(billing_settings.pricebook_path), "org-cached", period
    )
    lines = {line.description.split(" @ ")[0]: line for line in preview.lines}
    cached_line = lines["composer-2.5 standard cached input tokens"]
    assert (cached_line.quantity, cached_line.amount_nano_usd) == (
        sum(cached),
        sum(cached) * CACHED,
    )
    engine.dispose()
