"""Script calls batched into pipelines (``billing.batching``), against a real Valkey: each
caller gets its own reply in call order, concurrent calls share round trips, scripts are
reloaded after Redis forgets them, and a batch that cannot be sent fails every call in it
with the error a lone call would have had."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from billing.batching import Script, ScriptBatcher

#: Appends ARGV[1] to the list KEYS[1] and returns the list's new length.
APPEND = Script("return redis.call('RPUSH', KEYS[1], ARGV[1])")
FAIL = Script("return redis.error_reply('ERR refused ' .. ARGV[1])")


class CountingBatcher(ScriptBatcher):
    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self.round_trips = 0

    async def _pipeline(self, batch: Any) -> list[Any]:
        self.round_trips += 1
        return await super()._pipeline(batch)


def run(redis_url: str, scenario: Any) -> Any:
    async def main() -> Any:
        redis = Redis.from_url(redis_url)
        try:
            return await scenario(redis)
        finally:
            await redis.aclose()  # type: ignore[attr-defined]

    return asyncio.run(main())


def test_concurrent_calls_share_round_trips_and_keep_their_order(redis_url: str) -> None:
    async def scenario(redis: Redis) -> tuple[list[int], list[bytes], int]:
        await redis.delete("batching:order")
        batcher = CountingBatcher(redis)
        replies = await asyncio.gather(
            *(batcher.call(APPEND, ["batching:order"], [str(i)]) for i in range(200))
        )
        stored = await redis.lrange("batching:order", 0, -1)
        return replies, stored, batcher.round_trips

    replies, stored, round_trips = run(redis_url, scenario)
    assert replies == list(range(1, 201))  # each caller its own reply
    assert stored == [str(i).encode() for i in range(200)]  # run in the order called
    assert round_trips < 10  # the first call alone, then the rest together


def test_a_lone_call_goes_at_once_and_errors_reach_only_their_caller(redis_url: str) -> None:
    async def scenario(redis: Redis) -> tuple[Any, ...]:
        batcher = CountingBatcher(redis)
        alone = await asyncio.wait_for(batcher.call(APPEND, ["batching:alone"], ["x"]), 5)
        mixed = await asyncio.gather(
            batcher.call(APPEND, ["batching:mixed"], ["a"]),
            batcher.call(FAIL, [], ["b"]),
            batcher.call(APPEND, ["batching:mixed"], ["c"]),
            return_exceptions=True,
        )
        return alone, mixed, batcher.round_trips

    run(redis_url, lambda redis: redis.delete("batching:alone", "batching:mixed"))
    alone, (first, failed, third), round_trips = run(redis_url, scenario)
    assert alone == 1 and round_trips == 3  # alone; then the first of three; then two
    assert (first, third) == (1, 2)
    assert isinstance(failed, redis_errors.ResponseError) and "refused b" in str(failed)


def test_scripts_are_loaded_again_after_redis_forgets_them(redis_url: str) -> None:
    async def scenario(redis: Redis) -> list[int]:
        batcher = ScriptBatcher(redis)
        await redis.delete("batching:flushed")
        await batcher.call(APPEND, ["batching:flushed"], ["before"])
        await redis.script_flush()
        return list(
            await asyncio.gather(
                *(batcher.call(APPEND, ["batching:flushed"], [str(i)]) for i in range(5))
            )
        )

    assert run(redis_url, scenario) == [2, 3, 4, 5, 6]  # each ran exactly once


def test_an_unreachable_redis_fails_every_call_of_the_batch() -> None:
    async def scenario() -> list[Any]:
        redis = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
        batcher = ScriptBatcher(redis)
        try:
            return list(
                await asyncio.gather(
                    *(batcher.call(APPEND, ["k"], [str(i)]) for i in range(3)),
                    return_exceptions=True,
                )
            )
        finally:
            await redis.aclose()  # type: ignore[attr-defined]

    errors = asyncio.run(scenario())
    assert len(errors) == 3
    assert all(isinstance(e, redis_errors.ConnectionError) for e in errors)


@pytest.mark.parametrize("cancelled", [0, 1])
def test_a_caller_that_gives_up_leaves_the_batch_to_the_others(
    redis_url: str, cancelled: int
) -> None:
    async def scenario(redis: Redis) -> list[Any]:
        await redis.delete("batching:cancel")
        batcher = ScriptBatcher(redis)
        calls = [
            asyncio.ensure_future(batcher.call(APPEND, ["batching:cancel"], [str(i)]))
            for i in range(3)
        ]
        await asyncio.sleep(0)
        calls[cancelled].cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        await batcher.aclose()
        return [*results, await redis.llen("batching:cancel")]

    *results, stored = run(redis_url, scenario)
    assert isinstance(results[cancelled], asyncio.CancelledError)
    assert [r for i, r in enumerate(results) if i != cancelled] == [
        n for n in (1, 2, 3) if n != cancelled + 1
    ]
    assert stored == 3  # the call given up on still ran: its caller may not know
