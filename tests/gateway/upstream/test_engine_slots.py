"""How an engine's slots are shared between the tiers (gateway/upstream/engine_slots.py), and what a
client sees when its tier's engines stay full."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx
import pytest

from gateway.upstream.engine_slots import EngineBusy, EngineSlots
from gateway.upstream.slot_policy import SlotPolicy, slot_policies
from serving.settings import DEFAULT_VARIANTS_FILE
from serving.variants import load_variants
from tests.support.gateway import GatewayServer, held_stream, slot_holding_body

SHARED = SlotPolicy(size=8, shared=True, standard_max_share=0.75, standard_min_share=0.25)


def test_policy_shares() -> None:
    assert (SHARED.standard_cap, SHARED.standard_floor) == (6, 2)
    alone = SlotPolicy(size=16, shared=False)
    assert (alone.standard_cap, alone.standard_floor) == (16, 0)


async def test_standard_leaves_room_for_fast() -> None:
    slots = EngineSlots(SHARED)
    for _ in range(6):
        await slots.take("standard", 1)
    with pytest.raises(EngineBusy):
        await slots.take("standard", 0.05)
    # Fast finds its slots free at once, up to the engine's batch size.
    assert [await slots.take("fast", 0.05) for _ in range(2)] == [1, 1]
    with pytest.raises(EngineBusy):
        await slots.take("fast", 0.05)


async def test_standard_is_never_starved_by_fast() -> None:
    slots = EngineSlots(SHARED)
    for _ in range(8):
        await slots.take("fast", 1)
    waiting_standard = asyncio.create_task(slots.take("standard", 5))
    waiting_fast = asyncio.create_task(slots.take("fast", 5))
    await asyncio.sleep(0)
    # A freed slot goes to standard (below its floor), though fast asked too.
    slots.give_back("fast", 1)
    assert await waiting_standard == 1
    assert not waiting_fast.done()
    # One standard slot is owed still (floor 2): fast may not take the last free slot...
    second_standard = asyncio.create_task(slots.take("standard", 5))
    await asyncio.sleep(0)
    slots.give_back("fast", 1)
    assert await second_standard == 1 and not waiting_fast.done()
    # ...and once standard has its floor, fast gets the next one.
    slots.give_back("fast", 1)
    assert await waiting_fast == 1
    assert slots.in_flight == {"fast": 6, "standard": 2}


async def test_first_come_first_served_within_a_tier_and_waits_are_bounded() -> None:
    slots = EngineSlots(SlotPolicy(size=1, shared=False))
    await slots.take("fast", 1)
    first = asyncio.create_task(slots.take("fast", 5))
    await asyncio.sleep(0)
    assert slots.try_take("fast") is None  # a newcomer queues behind the waiter
    second = asyncio.create_task(slots.take("fast", 5))
    await asyncio.sleep(0)
    slots.give_back("fast", 1)
    assert await first == 1 and not second.done()
    second.cancel()  # its client left: nothing is held for it
    with pytest.raises(asyncio.CancelledError):
        await second
    slots.give_back("fast", 1)
    assert slots.in_flight["fast"] == 0


async def test_a_request_takes_a_slot_per_sequence() -> None:
    slots = EngineSlots(SHARED)
    assert await slots.take("standard", 1, weight=4) == 4
    # Larger than standard may ever hold: clamped to its cap, it runs alone.
    with pytest.raises(EngineBusy):
        await slots.take("standard", 0.05, weight=64)
    slots.give_back("standard", 4)
    assert await slots.take("standard", 1, weight=64) == 6


def test_policies_follow_the_variants() -> None:
    book = load_variants(DEFAULT_VARIANTS_FILE)
    shared = slot_policies({"fast": ["http://e"], "standard": ["http://e"]}, book, "cpu")
    assert shared["http://e"] == SlotPolicy(8, True, 0.75, 0.25, fair_headroom=2, keep_s=0.05)
    split = slot_policies({"fast": ["http://f"], "standard": ["http://s"]}, book, "gpu")
    assert (split["http://f"].size, split["http://s"].size) == (16, 256)
    assert not split["http://f"].shared


def test_a_full_tier_answers_503_with_retry_after_and_fast_still_gets_in(
    stalled_gateway: Callable[..., GatewayServer], api_key: str
) -> None:
    # 8 slots, 6 for standard; streams hold theirs.
    gateway = stalled_gateway(max_queue_wait_s={"fast": 30, "standard": 1})
    headers = {"authorization": f"Bearer {api_key}"}

    with (
        httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as client,
        contextlib.ExitStack() as held,
    ):
        for _ in range(6):
            held.enter_context(held_stream(client, "composer-2.5-standard"))
        standard = slot_holding_body("composer-2.5-standard")
        full = client.post("/v1/chat/completions", json=standard)
        assert full.status_code == 503
        assert full.headers["retry-after"] == "1"
        assert full.json()["error"]["code"] == "engine_overloaded"
        # The slots standard may not take are there for fast.
        fast = client.post(
            "/v1/chat/completions",
            json={**slot_holding_body("composer-2.5-fast"), "stream": False, "max_tokens": 1},
        )
        assert fast.status_code == 200, fast.text
