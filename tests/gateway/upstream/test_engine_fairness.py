"""Orgs share a tier's engine slots fairly: a freed slot goes to the waiting org holding the
fewest, so one org's tenfold concurrency queues behind itself; an org over its share leaves
headroom for one under its share; alone, an org takes all."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from gateway.upstream.engine_slots import EngineSlots
from gateway.upstream.slot_policy import SlotPolicy
from serving.vocabulary import Tier

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _turns() -> None:
    """Let granted waiters' tasks resume (a grant reaches its task a few loop turns on)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def _queued(slots: EngineSlots, org: str, count: int) -> list[asyncio.Task[int]]:
    tasks = [asyncio.create_task(slots.take("fast", 30, 1, org)) for _ in range(count)]
    await asyncio.sleep(0)  # each is now waiting in the queue, in order
    return tasks


async def test_a_busy_org_queues_behind_itself_not_in_front_of_another() -> None:
    slots = EngineSlots(SlotPolicy(size=4, shared=False, fair_headroom=0))
    for _ in range(4):
        assert await slots.take("fast", 1, 1, "org-a") == 1
    flood = await _queued(slots, "org-a", 10)
    [late] = await _queued(slots, "org-b", 1)
    slots.give_back("fast", 1, "org-a")
    await _turns()
    assert late.done() and not any(task.done() for task in flood)
    assert slots.held == {("fast", "org-a"): 3, ("fast", "org-b"): 1}
    # With org-b served and nobody else waiting, org-a's queue drains in its own order.
    for expected_done in range(1, 4):
        slots.give_back("fast", 1, "org-a")
        await _turns()
        assert [task.done() for task in flood].count(True) == expected_done
        assert flood[expected_done - 1].done()
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


async def test_an_org_alone_takes_every_slot_and_gives_them_all_back() -> None:
    slots = EngineSlots(SlotPolicy(size=3, shared=False))
    held = [await slots.take("fast", 1, 1, "org-a") for _ in range(3)]
    waiting = await _queued(slots, "org-a", 2)
    for taken in held:
        slots.give_back("fast", taken, "org-a")
        await _turns()
    assert all(task.done() for task in waiting)
    for task in waiting:
        slots.give_back("fast", task.result(), "org-a")
    assert slots.held == {} and slots.in_flight["fast"] == 0


async def test_the_tier_shares_still_hold_with_orgs() -> None:
    """On a shared engine standard keeps its cap whatever the orgs."""
    slots = EngineSlots(SlotPolicy(size=4, shared=True))
    for org in ("org-a", "org-b", "org-c"):
        assert slots.try_take("standard", 1, org) == 1
    assert slots.try_take("standard", 1, "org-d") is None  # 0.75 of 4
    assert slots.try_take("fast", 1, "org-d") == 1


async def test_an_org_over_its_share_leaves_headroom_for_one_under_it() -> None:
    # No kept slots (their own test): the headroom alone.
    policy = SlotPolicy(size=8, shared=False, fair_headroom=2, recent_s=0.2, keep_s=0.0)
    slots = EngineSlots(policy)
    assert slots.try_take("fast", 1, "org-b") == 1
    # org-a (share 4 of 8 with org-b active) takes up to 2 free slots less than it could.
    assert [slots.try_take("fast", 1, "org-a") for _ in range(6)] == [1] * 5 + [None]
    flood = await _queued(slots, "org-a", 5)
    # org-b's next requests start at once, in front of org-a's queue, while under its share.
    late = await _queued(slots, "org-b", 2)
    await _turns()
    assert all(task.done() for task in late) and not any(task.done() for task in flood)
    assert slots.held == {("fast", "org-a"): 5, ("fast", "org-b"): 3}
    # org-b goes quiet: within recent_s its headroom is kept, then org-a gets every slot
    # without waiting for another request to end.
    for _ in range(3):
        slots.give_back("fast", 1, "org-b")
    await _turns()
    assert [task.done() for task in flood].count(True) == 1  # 6 of 8: 2 kept for org-b
    await asyncio.sleep(0.4)
    await _turns()
    assert [task.done() for task in flood].count(True) == 3
    assert slots.held == {("fast", "org-a"): 8}
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)


async def test_slots_an_org_gives_back_together_stay_its_own_for_a_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """org-b's four requests end together (streams of one length, started together):
    its next four, a moment later, find the four slots it gave back, though org-a's flood
    waits and the headroom is two. Past ``keep_s``, only the headroom is kept for it."""
    clock = [1000.0]
    monkeypatch.setattr("gateway.upstream.engine_slots.time.monotonic", lambda: clock[0])
    policy = SlotPolicy(size=8, shared=False, fair_headroom=2, recent_s=5.0, keep_s=0.05)
    slots = EngineSlots(policy)
    assert [slots.try_take("fast", 1, org) for org in ["org-b"] * 4 + ["org-a"] * 4] == [1] * 8
    flood = await _queued(slots, "org-a", 10)
    for _ in range(4):
        slots.give_back("fast", 1, "org-b")
    await _turns()
    assert not any(task.done() for task in flood)
    clock[0] += 0.01
    back = await _queued(slots, "org-b", 4)
    await _turns()
    assert all(task.done() for task in back) and not any(task.done() for task in flood)
    assert slots.held == {("fast", "org-a"): 4, ("fast", "org-b"): 4}
    # The same, with org-b back only after keep_s: org-a was handed all but the headroom.
    for _ in range(4):
        slots.give_back("fast", 1, "org-b")
    clock[0] += 0.06
    await asyncio.sleep(0)  # the timer set for the end of keep_s is due: it hands them on
    await _turns()
    assert [task.done() for task in flood].count(True) == 2
    late = await _queued(slots, "org-b", 4)
    await _turns()
    assert [task.done() for task in late].count(True) == 2
    for task in flood + late:
        task.cancel()
    await asyncio.gather(*flood, *late, return_exceptions=True)


async def test_headroom_is_no_more_than_the_others_are_short() -> None:
    """org-b holds 3 of its share of 4: one slot is kept for it, not two."""
    slots = EngineSlots(SlotPolicy(size=8, shared=False, fair_headroom=2))
    assert [slots.try_take("fast", 1, "org-b") for _ in range(3)] == [1, 1, 1]
    assert [slots.try_take("fast", 1, "org-a") for _ in range(5)] == [1, 1, 1, 1, None]


async def test_an_org_holding_nothing_is_never_held_back() -> None:
    """Even for a request larger than its share (7 sequences of 8, org-b recently done)."""
    slots = EngineSlots(SlotPolicy(size=8, shared=False, fair_headroom=2))
    slots.give_back("fast", slots.try_take("fast", 1, "org-b") or 0, "org-b")
    assert await slots.take("fast", 1, 7, "org-a") == 7


async def test_a_held_back_waiter_lets_another_orgs_waiter_go_first() -> None:
    slots = EngineSlots(SlotPolicy(size=8, shared=False, fair_headroom=2))
    assert slots.try_take("fast", 1, "org-b") == 1
    assert slots.try_take("fast", 5, "org-a") == 5
    [a_more] = await _queued(slots, "org-a", 1)  # over its share: 2 slots kept for org-b
    [b_more] = await _queued(slots, "org-b", 1)
    await _turns()
    assert b_more.done() and not a_more.done()
    a_more.cancel()
    await asyncio.gather(a_more, return_exceptions=True)


async def test_headroom_is_handed_on_once_the_last_quiet_org_is_no_longer_active() -> None:
    """The re-grant timer follows the latest end: org-b's second request ends after the
    timer was set for its first."""
    slots = EngineSlots(SlotPolicy(size=8, shared=False, fair_headroom=2, recent_s=0.2))
    assert slots.try_take("fast", 6, "org-a") == 6
    assert [slots.try_take("fast", 1, "org-b") for _ in range(2)] == [1, 1]
    [a_more] = await _queued(slots, "org-a", 1)
    slots.give_back("fast", 1, "org-b")
    await asyncio.sleep(0.1)
    slots.give_back("fast", 1, "org-b")
    await asyncio.sleep(0.5)
    await _turns()
    assert a_more.done() and slots.held == {("fast", "org-a"): 7}


async def test_room_kept_as_headroom_is_no_room_to_the_org_over_its_share() -> None:
    slots = EngineSlots(SlotPolicy(size=8, shared=False, fair_headroom=2))
    assert slots.try_take("fast", 1, "org-b") == 1
    assert slots.try_take("fast", 5, "org-a") == 5
    assert not slots.has_room("fast", 1, "org-a")
    assert slots.has_room("fast", 1, "org-b") and slots.has_room("fast", 1)


async def test_orgs_done_long_ago_are_forgotten() -> None:
    """What an engine remembers of orgs' last requests holds the recent ones only: not
    every org that ever sent one (a gateway's lifetime of customers)."""
    slots = EngineSlots(SlotPolicy(size=8, shared=False, fair_headroom=2, recent_s=0.1))
    for n in range(500):
        org = f"org-{n}"
        slots.give_back("fast", slots.try_take("fast", 1, org) or 0, org)
    await asyncio.sleep(0.25)
    slots.give_back("fast", slots.try_take("fast", 1, "org-late") or 0, "org-late")
    # The record itself, bounded: the late org alone.
    assert {t: list(done) for t, done in slots._last_done.items()} == {
        "fast": ["org-late"],
        "standard": [],
    }


async def test_a_request_that_stops_waiting_leaves_the_line_however_deep_it_stood() -> None:
    """Given up in the middle of its org's line (cancelled, or its wait ran out), a
    request no longer counts as waiting nor gets a slot; the line empties as served."""
    slots = EngineSlots(SlotPolicy(size=1, shared=False, fair_headroom=0))
    assert slots.try_take("fast", 1, "org-a") == 1
    first, middle, last = await _queued(slots, "org-a", 3)
    other = (await _queued(slots, "org-b", 1))[0]
    middle.cancel()
    await _turns()
    assert slots.waiting("fast") == 3
    slots.give_back("fast", 1, "org-a")
    await _turns()
    assert first.done() and not other.done()  # org-a's first came before org-b's
    slots.give_back("fast", await first, "org-a")
    await _turns()
    # Both hold none: org-a's next waiting request came before org-b's, the middle skipped.
    assert last.done() and not other.done() and middle.cancelled()
    slots.give_back("fast", await last, "org-a")
    await _turns()
    slots.give_back("fast", await other, "org-b")
    assert slots.waiting("fast") == 0 and slots.held == {}
    assert slots._queues == {"fast": {}, "standard": {}} and not slots._arrival


async def test_a_wait_ended_by_anything_leaves_nothing_waiting_or_held() -> None:
    """A ``take`` whose coroutine is closed while it waits (not cancelled, not timed out:
    its caller dropped it) leaves the line; one closed after its grant gives it back."""
    slots = EngineSlots(SlotPolicy(size=1, shared=False, fair_headroom=0))
    assert slots.try_take("fast", 1, "org-a") == 1
    waiting = slots.take("fast", 5, 1, "org-b")
    waiting.send(None)  # runs until it waits for its grant
    assert slots.waiting("fast") == 1
    waiting.close()
    assert slots.waiting("fast") == 0 and not slots._queues["fast"] and not slots._arrival
    granted = slots.take("fast", 5, 1, "org-b")
    granted.send(None)
    slots.give_back("fast", 1, "org-a")  # granted to it, before it runs again
    assert slots.held == {("fast", "org-b"): 1}
    granted.close()
    assert slots.held == {} and slots.in_flight["fast"] == 0 and slots.waiting("fast") == 0


def leaves_headroom_reference(
    slots: EngineSlots, tier: str, org: str, weight: int, now: float
) -> bool:
    """The headroom rule as the module's docstring states it, by brute force: the tier's
    active orgs are those holding slots, waiting, or done within ``recent_s``; the slots
    other orgs gave back within ``keep_s`` (``_kept``) are theirs."""
    policy = slots.policy
    free_after = slots._fits(tier, weight)  # the tiers' split: not what is checked here
    assert free_after is not None
    kept = sum(n for o, n in slots._kept[tier].items(now).items() if o != org)
    if free_after >= max(policy.fair_headroom, kept) or not slots.held.get((tier, org), 0):
        return True
    active = {o for (t, o) in slots.held if t == tier} | set(slots._queues[tier])
    active |= {o for o, at in slots._last_done[tier].items() if at >= now - policy.recent_s}
    others = active - {org}
    if not others:
        return True
    tier_slots = policy.standard_cap if tier == "standard" else policy.size
    share = tier_slots / (len(others) + 1)
    if slots.held[(tier, org)] + weight <= share:
        return True
    if free_after < kept:
        return False
    short = sum(max(0, math.ceil(share - slots.held.get((tier, o), 0))) for o in others)
    return short < policy.fair_headroom and free_after >= short


@pytest.mark.parametrize(
    ("tier", "policy"),
    [
        ("fast", SlotPolicy(size=12, shared=False, fair_headroom=2, recent_s=1.0)),
        ("standard", SlotPolicy(size=16, shared=True, fair_headroom=3, recent_s=1.0)),
    ],
)
async def test_headroom_decisions_match_the_reference_over_random_traffic(
    monkeypatch: pytest.MonkeyPatch, tier: Tier, policy: SlotPolicy
) -> None:
    """Counting the recent orgs instead of walking them decides as the brute force does:
    many orgs, each taking and giving back, the clock moving past ``recent_s``."""
    clock = [1000.0]
    monkeypatch.setattr("gateway.upstream.engine_slots.time.monotonic", lambda: clock[0])
    rng = random.Random(7)
    slots = EngineSlots(policy)
    cap = policy.standard_cap if tier == "standard" else policy.size
    holding: list[tuple[str, int]] = []
    orgs = [f"org-{n}" for n in range(40)]
    near_full = 0
    for _ in range(4000):
        clock[0] += rng.choice((0.0, 0.01, 0.05, 0.3))
        org, weight = rng.choice(orgs[: rng.choice((3, 40))]), rng.choice((1, 1, 2))
        if holding and rng.random() < 0.45:
            gone = holding.pop(rng.randrange(len(holding)))
            slots.give_back(tier, gone[1], gone[0])
            continue
        fits = slots._fits(tier, weight) is not None
        expected = fits and leaves_headroom_reference(slots, tier, org, weight, clock[0])
        assert slots.has_room(tier, weight, org) == expected
        near_full += fits and slots.in_flight[tier] + weight > cap - policy.fair_headroom
        taken = slots.try_take(tier, weight, org)
        assert (taken is not None) == expected
        if taken:
            holding.append((org, taken))
    assert near_full > 200  # the headroom rule itself was exercised, not only free room


def grantable_reference(slots: EngineSlots, tier: str, now: float) -> asyncio.Future[int] | None:
    """Who is granted next, by brute force: every waiting org's first request, in order of
    the slots its org holds, then of arrival; the first that fits and leaves the headroom
    (nobody overtakes one that does not fit)."""
    firsts = [(org, line[0]) for org, line in slots._queues[tier].items()]
    firsts.sort(key=lambda item: (slots.held.get((tier, item[0]), 0), slots._arrival[item[1]]))
    for org, waiter in firsts:
        weight = slots._weights[waiter]
        if slots._fits(tier, weight) is None:
            return None
        if leaves_headroom_reference(slots, tier, org, weight, now):
            return waiter
    return None


@pytest.mark.parametrize("shared", [False, True])
async def test_who_goes_next_matches_the_reference_with_many_orgs_waiting(
    monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    """The heap of turns and the busy orgs kept as they change decide as the brute force
    over every waiting org does: many orgs waiting, taking, giving back, giving up, the
    clock moving past ``recent_s``."""
    clock = [1000.0]
    monkeypatch.setattr("gateway.upstream.engine_slots.time.monotonic", lambda: clock[0])
    rng = random.Random(11)
    slots = EngineSlots(SlotPolicy(size=8, shared=shared, fair_headroom=2, recent_s=1.0))
    tiers: tuple[Tier, ...] = ("fast", "standard") if shared else ("fast",)
    orgs = [f"org-{n}" for n in range(30)]
    requests: list[tuple[asyncio.Task[int], Tier, str]] = []
    held_back = handed_on = 0
    for _ in range(1500):
        clock[0] += rng.choice((0.0, 0.0, 0.02, 0.4))
        # Grants held until the decisions are compared: every step has one to compare.
        slots._grant = lambda: None  # type: ignore[method-assign]
        step = rng.random()
        granted = [r for r in requests if r[0].done() and not r[0].cancelled()]
        waiting = [r for r in requests if not r[0].done()]
        if step < 0.45:
            tier, org = rng.choice(tiers), rng.choice(orgs[: rng.choice((2, 30))])
            task = asyncio.create_task(slots.take(tier, 600, rng.choice((1, 1, 2)), org))
            requests.append((task, tier, org))
        elif step < 0.85 and granted:
            request = rng.choice(granted)
            requests.remove(request)
            slots.give_back(request[1], request[0].result(), request[2])
        elif waiting:
            rng.choice(waiting)[0].cancel()
        await _turns()
        requests = [r for r in requests if not r[0].cancelled()]
        for tier in tiers:
            busy = {o for (t, o) in slots.held if t == tier} | set(slots._queues[tier])
            assert slots._busy[tier] == busy
            assert slots._busy_recent[tier] == len(busy & set(slots._last_done[tier]))
            kept = slots._kept[tier]
            assert kept.for_others("", clock[0]) == sum(kept.items(clock[0]).values())
            if slots.waiting(tier):
                expected = grantable_reference(slots, tier, clock[0])
                assert slots._grantable(tier) is expected
                held_back += expected is None
                handed_on += expected is not None
        del slots._grant
        slots._grant()
        await _turns()
    for task, _, _ in requests:
        task.cancel()
    await _turns()
    assert held_back > 150 and handed_on > 150  # both kinds of decision were compared
