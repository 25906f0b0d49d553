"""Settlements sent together (``billing.meter.settlement``), against the session's real Valkey:
the settlements of a moment go in one script call, each applied exactly once with its own
reservation released, whether its caller waits for it (``settle``) or not
(``settle_nowait``, the gateway's); one record's bad key fails only that record (logged when
nobody waits for it); what Redis cannot take (unreachable, out of memory) is spooled,
whether its caller still waits or not, and replays exactly; and a meter that closes sends
what is still waiting."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from billing.meter.protocol import AdmissionRefused
from billing.meter.redis_meter import RedisMeter
from billing.meter.settlement import Record, SettlementQueue
from billing.settings import BillingSettings
from tests.support.builders import admission_request, usage_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


class CountingMeter(RedisMeter):
    """A meter that counts its settle script calls and the records in each."""

    def __init__(self, settings: BillingSettings) -> None:
        super().__init__(settings)
        self.batches: list[int] = []
        send = self.usage.send

        async def counted(records: list[Record]) -> list[Any]:
            self.batches.append(len(records))
            return await send(records)

        self.usage.send = counted  # type: ignore[method-assign]


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

    budget = await meter.redis.hgetall(meter.keys.budget_prefix("org-batch") + period)
    used = sum(100 * 3000 + i * 15000 for i in range(40))
    assert {k.decode(): int(v) for k, v in budget.items()} == {"reserved": 0, "used": used}
    assert await meter.redis.zcard(meter.keys.budget_prefix("org-batch") + period + ":resv") == 0
    entries = await meter.redis.xrange(meter.keys.usage_stream_of("org-batch"))
    events = [json.loads(fields[b"event"]) for _, fields in entries]
    assert [e["event_id"] for e in events] == [r.request_id for r in requests]  # in order

    # Settled again, with others new: only the new ones count.
    again = admission_request(org="org-batch", key="key-batch", prompt=100)
    fresh = await meter.admit(again)
    await asyncio.gather(
        meter.settle(admissions[0], usages[0]),
        meter.settle(fresh, usage_for(again, completion=0, cached=0)),
    )
    budget = await meter.redis.hgetall(meter.keys.budget_prefix("org-batch") + period)
    assert int(budget[b"used"]) == used + 100 * 3000
    assert len(await meter.redis.xrange(meter.keys.usage_stream_of("org-batch"))) == 41


async def test_one_records_bad_key_fails_only_that_record(meter: CountingMeter) -> None:
    good = admission_request(org="org-good", key="key-batch", prompt=10)
    bad = admission_request(org="org-bad", key="key-batch", prompt=10)
    admitted = [await meter.admit(good), await meter.admit(bad)]
    period = str(admitted[0].reservation_id).split("/")[0]
    await meter.redis.delete(meter.keys.budget_prefix("org-bad") + period)
    await meter.redis.set(meter.keys.budget_prefix("org-bad") + period, "not a hash")  # WRONGTYPE
    results = await asyncio.gather(
        meter.settle(admitted[0], usage_for(good, completion=1)),
        meter.settle(admitted[1], usage_for(bad, completion=1)),
        return_exceptions=True,
    )
    assert meter.batches == [2]
    assert results[0] is None
    assert isinstance(results[1], redis_errors.ResponseError) and "WRONGTYPE" in str(results[1])
    used = await meter.redis.hget(meter.keys.budget_prefix("org-good") + period, "used")
    assert int(used) == 10 * 3000 + 1 * 15000
    assert meter.usage.spool.pending_count() == 0  # a bad record is not retried forever


async def test_settlements_handed_over_without_waiting_are_applied_exactly_once(
    meter: CountingMeter, caplog: pytest.LogCaptureFixture
) -> None:
    requests = [admission_request(org="org-nowait", key="key-batch", prompt=10) for _ in range(5)]
    admissions = [await meter.admit(request) for request in requests]
    period = str(admissions[0].reservation_id).split("/")[0]
    for i, (admission, request) in enumerate(zip(admissions, requests, strict=True)):
        meter.settle_nowait(admission, usage_for(request, completion=i))
    assert len(meter.reservations) == 0  # released from renewal at once
    meter.settle_nowait(admissions[0], usage_for(requests[0], completion=0))  # a second time
    bad = admission_request(org="org-nowait-bad", key="key-batch", prompt=10)
    bad_admission = await meter.admit(bad)
    await meter.redis.delete(meter.keys.budget_prefix("org-nowait-bad") + period)
    await meter.redis.set(meter.keys.budget_prefix("org-nowait-bad") + period, "not a hash")
    unpriceable = admission_request(org="org-nowait", key="key-batch", prompt=10)
    unpriceable_admission = await meter.admit(unpriceable)
    with caplog.at_level(logging.ERROR, logger="billing.meter.redis_meter"):
        meter.settle_nowait(bad_admission, usage_for(bad, completion=1))
        # More cached tokens than prompt tokens: priced when its batch goes, it fails alone.
        meter.settle_nowait(unpriceable_admission, usage_for(unpriceable, completion=1, cached=11))
        await meter.aclose()  # what was handed over is sent before the meter closes
    assert meter.batches == [7]  # together, in one call (the unpriceable one not sent)

    budget = await meter.redis.hgetall(meter.keys.budget_prefix("org-nowait") + period)
    used = sum(10 * 3000 + i * 15000 for i in range(5))
    # What could not be priced keeps its worst case reserved until its reservation's TTL
    # (no longer renewed) gives it back: never less than it may have cost.
    held = unpriceable_admission.reserved_nano_usd
    assert {k.decode(): int(v) for k, v in budget.items()} == {"reserved": held, "used": used}
    entries = await meter.redis.xrange(meter.keys.usage_stream_of("org-nowait"))
    assert [json.loads(f[b"event"])["event_id"] for _, f in entries] == [
        r.request_id for r in requests
    ]
    # The bad records failed alone, each said in the log with its request id.
    assert sorted(r.getMessage() for r in caplog.records) == sorted(
        f"billing settle failed for request {r.request_id}" for r in (bad, unpriceable)
    )
    assert "WRONGTYPE" in caplog.text and "exceed prompt tokens" in caplog.text


async def test_what_redis_refuses_to_write_is_spooled_and_replays_exactly(
    meter: CountingMeter, redis_url: str
) -> None:
    requests = [admission_request(org="org-oom", key="key-batch", prompt=10) for _ in range(3)]
    admitted = [await meter.admit(r) for r in requests]
    period = str(admitted[0].reservation_id).split("/")[0]
    admin = Redis.from_url(redis_url)
    await admin.config_set("maxmemory", "1")  # every write refused: OOM
    try:
        waiting = [
            asyncio.ensure_future(meter.settle(a, usage_for(r, completion=2)))
            for a, r in zip(admitted, requests, strict=True)
        ]
        await asyncio.sleep(0)
        waiting[0].cancel()  # a caller that stops waiting: its record is spooled all the same
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert await meter.usage.replay_spool() == 0  # still refused: stays spooled
        with pytest.raises(AdmissionRefused) as refused:  # a 503, not a 500
            await meter.admit(admission_request(org="org-oom", key="key-batch", prompt=10))
        assert refused.value.status_code == 503
    finally:
        await admin.config_set("maxmemory", "0")
        await admin.aclose()
    assert isinstance(results[0], asyncio.CancelledError) and results[1:] == [None, None]
    assert meter.usage.spool.pending_count() == 3
    assert await meter.redis.hget(meter.keys.budget_prefix("org-oom") + period, "used") is None

    assert await meter.usage.replay_spool() == 3
    assert await meter.usage.replay_spool() == 0
    used = await meter.redis.hget(meter.keys.budget_prefix("org-oom") + period, "used")
    assert int(used) == 3 * (10 * 3000 + 2 * 15000)
    entries = await meter.redis.xrange(meter.keys.usage_stream_of("org-oom"))
    ids = sorted(json.loads(fields[b"event"])["event_id"] for _, fields in entries)
    assert ids == sorted(r.request_id for r in requests)


async def test_an_unreachable_redis_spools_each_record_of_the_batch(
    billing_settings: BillingSettings,
) -> None:
    settings = billing_settings.model_copy(
        update={"redis_url": "redis://127.0.0.1:1/0", "redis_timeout_s": 1.0}
    )
    meter = RedisMeter(settings)
    try:
        records = [{"event_id": str(i), "org_id": "o", "period": "2026-12",
                    "allowance_nano_usd": 1, "event": "{}"} for i in range(5)]  # fmt: skip
        outcomes = await meter.usage.write(records)
        assert outcomes == [None] * 5
        assert meter.usage.spool.pending_count() == 5
    finally:
        await meter.aclose()


async def test_closing_sends_what_is_waiting_even_if_its_caller_gave_up() -> None:
    sent: list[Record] = []

    async def send(records: list[Record]) -> list[None]:
        sent.extend(records)
        return [None] * len(records)

    failed: list[tuple[Record, BaseException]] = []
    # Only a close or a full batch sends.
    queue = SettlementQueue(send, window_s=3600, unawaited=lambda r, e: failed.append((r, e)))
    waiter = asyncio.ensure_future(queue.submit({"event_id": "a"}))
    await asyncio.sleep(0)
    waiter.cancel()
    await queue.aclose()
    assert sent == [{"event_id": "a"}]
    await queue.submit({"event_id": "late"})  # after the close: sent at once, alone
    assert sent[-1] == {"event_id": "late"}

    queue.submit_nowait({"event_id": "late, not awaited"})  # sent at once too, in a task
    await queue.aclose()
    assert sent[-1] == {"event_id": "late, not awaited"}

    full = SettlementQueue(send, window_s=3600, max_batch=2, unawaited=lambda r, e: None)
    await asyncio.gather(full.submit({"event_id": "b"}), full.submit({"event_id": "c"}))
    assert sent[3:] == [{"event_id": "b"}, {"event_id": "c"}]
    assert failed == []


async def test_records_nobody_waits_for_go_with_the_others_and_their_failures_are_reported() -> (
    None
):
    batches: list[list[str]] = []
    broken = ValueError("this record's keys are in a bad state")

    async def send(records: list[Record]) -> list[BaseException | None]:
        batches.append([r["event_id"] for r in records])
        return [broken if r["event_id"].startswith("bad") else None for r in records]

    failed: list[tuple[str, BaseException]] = []
    queue = SettlementQueue(
        send, window_s=3600, max_batch=4, unawaited=lambda r, e: failed.append((r["event_id"], e))
    )
    queue.submit_nowait({"event_id": "a"})
    queue.submit_nowait({"event_id": "bad-1"})
    awaited = asyncio.ensure_future(queue.submit({"event_id": "b"}))
    gave_up = asyncio.ensure_future(queue.submit({"event_id": "bad-2"}))
    await asyncio.sleep(0)
    gave_up.cancel()  # the fourth record fills the batch: it is sent now
    await awaited
    await queue.aclose()
    assert batches == [["a", "bad-1", "b", "bad-2"]]
    # The failures nobody waited for are reported, each with its own error.
    assert failed == [("bad-1", broken), ("bad-2", broken)]
