"""Settlements sent together (``billing.settlement``), against the session's real Valkey:
the settlements of a moment go in one script call, each applied exactly once with its own
reservation released; a batch that cannot be sent fails every caller in it, so each spools
its own record; and a meter that closes sends what is still waiting."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from billing_support import admission_request, usage_for
from redis import exceptions as redis_errors

from billing.redis_meter import RedisMeter, budget_prefix
from billing.settings import BillingSettings
from billing.settlement import Record, SettlementQueue

pytestmark = pytest.mark.asyncio(loop_scope="session")


class CountingMeter(RedisMeter):
    """A meter that counts its settle script calls and the records in each."""

    def __init__(self, settings: BillingSettings) -> None:
        super().__init__(settings)
        self.batches: list[int] = []

    async def _send(self, records: list[Record]) -> None:
        self.batches.append(len(records))
        await super()._send(records)


@pytest.fixture
async def meter(billing_settings: BillingSettings) -> AsyncIterator[CountingMeter]:
    settings = billing_settings.model_copy(update={"settle_batch_window_ms": 50.0})
    meter = CountingMeter(settings)
    yield meter
    await meter.aclose()


async def test_settlements_of_a_moment_go_in_one_call_each_applied_once(
    meter: CountingMeter,
) -> None:
    requests = [admission_request(org="org-batch", key="key-batch", prompt=100) for _ in range(40)]
    admissions = [await meter.admit(request) for request in requests]
    period = str(admissions[0].reservation_id).split("/")[0]
    usages = [usage_for(r, completion=i, cached=0) for i, r in enumerate(requests)]

    await asyncio.gather(*(meter.settle(a, u) for a, u in zip(admissions, usages, strict=True)))
    assert sum(meter.batches) == 40
    assert len(meter.batches) < 40  # together, not one call each

    budget = await meter.redis.hgetall(budget_prefix("org-batch") + period)
    used = sum(100 * 3000 + i * 15000 for i in range(40))
    assert {k.decode(): int(v) for k, v in budget.items()} == {"reserved": 0, "used": used}
    assert await meter.redis.zcard(budget_prefix("org-batch") + period + ":resv") == 0
    entries = await meter.redis.xrange(meter.settings.usage_stream)
    events = [json.loads(fields[b"event"]) for _, fields in entries]
    assert [e["event_id"] for e in events] == [r.request_id for r in requests]  # in order

    # Settled again, with others new: only the new ones count.
    again = admission_request(org="org-batch", key="key-batch", prompt=100)
    fresh = await meter.admit(again)
    await asyncio.gather(
        meter.settle(admissions[0], usages[0]),
        meter.settle(fresh, usage_for(again, completion=0, cached=0)),
    )
    budget = await meter.redis.hgetall(budget_prefix("org-batch") + period)
    assert int(budget[b"used"]) == used + 100 * 3000
    assert len(await meter.redis.xrange(meter.settings.usage_stream)) == 41


async def test_a_batch_that_cannot_be_sent_fails_each_caller() -> None:
    sent: list[list[Record]] = []

    async def unreachable(records: list[Record]) -> None:
        sent.append(records)
        raise redis_errors.ConnectionError("Connection refused")

    queue = SettlementQueue(unreachable, window_s=0.01)
    results: list[Any] = await asyncio.gather(
        *(queue.submit({"event_id": str(i)}) for i in range(5)), return_exceptions=True
    )
    assert [len(batch) for batch in sent] == [5]
    assert all(isinstance(r, redis_errors.ConnectionError) for r in results)


async def test_closing_sends_what_is_waiting_even_if_its_caller_gave_up() -> None:
    sent: list[Record] = []

    async def send(records: list[Record]) -> None:
        sent.extend(records)

    queue = SettlementQueue(send, window_s=3600)  # only a close or a full batch sends
    waiter = asyncio.ensure_future(queue.submit({"event_id": "a"}))
    await asyncio.sleep(0)
    waiter.cancel()
    await queue.aclose()
    assert sent == [{"event_id": "a"}]

    full = SettlementQueue(send, window_s=3600, max_batch=2)
    await asyncio.gather(full.submit({"event_id": "b"}), full.submit({"event_id": "c"}))
    assert sent[1:] == [{"event_id": "b"}, {"event_id": "c"}]
