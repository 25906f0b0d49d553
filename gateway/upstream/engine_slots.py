"""Tier-aware admission into engines: an engine's request slots, shared between the tiers.

vLLM's priority scheduling only orders an engine's waiting queue: it keeps no room for
fast, and under fast load it lets standard wait without bound. So the gateway holds each
engine's requests to its batch size (``max-num-seqs``) itself and decides who goes next:

- On an engine both tiers share, standard may hold at most ``standard_max_share`` of the
  slots: the rest is room a fast request finds free at once.
- Standard is never starved: while standard requests wait and hold fewer than
  ``standard_min_share`` of the slots, fast may not take the slots that share needs, and
  a freed slot goes to standard first.
- A request that finds no slot waits in the gateway at most ``max_queue_wait_s`` for its
  tier; then ``EngineBusy`` (a 503 with ``retry-after``). On an engine of one tier
  (production pools) only the batch size and the wait apply.
- Within a tier, orgs share fairly: a freed slot goes to the waiting request whose org
  holds the fewest of the tier's slots on this engine (first come first served between
  equals), so an org sending ten times another's concurrency queues behind its own
  requests, not in front of the other's. It is work-conserving: an org alone can take
  every slot its tier may hold.
- A freed slot is handed on only when a request is waiting, so an org under its share
  whose next request arrives a moment later (a closed-loop client) would still find
  every slot taken by the busy org and wait for the next one to finish. While another
  org of the tier is under its share (the tier's slots over its active orgs: those
  holding slots, waiting, or done within ``recent_s``), an org over its share leaves
  ``fair_headroom`` slots free for it. Alone in a tier, an org takes them all.
- The slots an org gives back stay its own for ``keep_s`` against orgs over their share:
  an org whose clients' requests end together (streams of one length, started together)
  may drop further under its share than the headroom covers, and its next requests,
  arriving a moment later, would each wait for a request of the busy org to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections import OrderedDict, deque

from gateway.upstream.kept_slots import KeptSlots
from gateway.upstream.slot_policy import SlotPolicy
from serving.vocabulary import TIERS, Tier


class EngineBusy(Exception):
    """No slot freed up within the tier's longest queue wait."""

    def __init__(self, tier: str, waited_s: float) -> None:
        super().__init__(f"the {tier} tier's engines stayed full for {waited_s:.0f}s")
        self.tier = tier


class EngineSlots:
    """The slots of one engine; ``take`` before sending it a request, ``give_back`` once
    the request has left it (answered, failed or aborted)."""

    def __init__(self, policy: SlotPolicy) -> None:
        self.policy = policy
        self.in_flight: dict[str, int] = dict.fromkeys(TIERS, 0)
        #: Each tier's waiting requests by org, each org's in the order they came. The
        #: first of each is still waiting: one granted or given up leaves at once, one
        #: given up behind it once it is first. An overloaded engine's line may be
        #: thousands long: a grant looks at the orgs that wait, not at every request.
        self._queues: dict[str, dict[str, deque[asyncio.Future[int]]]] = {t: {} for t in TIERS}
        self._waiters: dict[str, int] = dict.fromkeys(TIERS, 0)
        #: Each waiter's place in the order of arrival (between orgs, the earlier first).
        self._arrival: dict[asyncio.Future[int], int] = {}
        self._arrivals = itertools.count()
        self._weights: dict[asyncio.Future[int], int] = {}
        #: The org of each waiter, and the slots each (tier, org) holds now.
        self._orgs: dict[asyncio.Future[int], str] = {}
        self.held: dict[tuple[str, str], int] = {}
        #: When each org of a tier last gave a slot back (``time.monotonic()``), oldest
        #: first: the orgs done within ``recent_s`` (older ones are dropped from the front).
        self._last_done: dict[str, OrderedDict[str, float]] = {t: OrderedDict() for t in TIERS}
        #: Each tier's busy orgs (holding slots or waiting for some), kept as they change,
        #: and how many of them are also among ``_last_done``: counted, not recomputed, as
        #: thousands of orgs may wait on an overloaded engine.
        self._busy: dict[str, set[str]] = {t: set() for t in TIERS}
        self._busy_recent: dict[str, int] = dict.fromkeys(TIERS, 0)
        #: Each tier's orgs in turn, a heap of (slots held, arrival of its first waiter,
        #: org, that waiter). An entry no longer true (the org's holding or first waiter
        #: changed since) is skipped when it comes up; a true one is pushed on each change.
        self._turns: dict[str, list[tuple[int, int, str, asyncio.Future[int]]]] = {
            t: [] for t in TIERS
        }
        #: Slots each org gave back within ``keep_s``, kept for it.
        self._kept: dict[str, KeptSlots] = {t: KeptSlots(policy.keep_s) for t in TIERS}
        self._regrant: asyncio.TimerHandle | None = None
        self._regrant_at = 0.0  # when it fires (``time.monotonic()``)

    def waiting(self, tier: str) -> int:
        return self._waiters[tier]

    def _fits(self, tier: str, weight: int) -> int | None:
        """The room ``tier`` has left once ``weight`` more slots are taken, or None if
        they do not fit: the batch size, standard's cap, the floor owed to standard."""
        policy = self.policy
        free = policy.size - sum(self.in_flight.values())
        if free < weight:
            return None
        if tier == "standard":
            room = policy.standard_cap - self.in_flight["standard"]
            return None if room < weight else min(free, room) - weight
        owed = policy.standard_floor - self.in_flight["standard"]
        if owed > 0 and self.waiting("standard") and free - weight < owed:
            return None
        return free - weight

    def _allowed(self, tier: str, weight: int, org: str | None = None) -> bool:
        """Whether ``weight`` slots of ``tier`` may go to ``org`` now (None: any org)."""
        left = self._fits(tier, weight)
        return left is not None and (org is None or self._leaves_headroom(tier, org, weight, left))

    def _leaves_headroom(self, tier: str, org: str, weight: int, free_after: int) -> bool:
        """False when ``org`` would take, over its share, the room kept for orgs under
        theirs (``fair_headroom`` slots at most, and no more than they are short), or
        slots another org gave back within ``keep_s``.

        The tier's active orgs are the busy ones and those done within ``recent_s``. The
        recent ones may be thousands (every customer of the last second), so they are
        counted, not walked: each that is not busy holds nothing and is short of its whole
        share, so at most ``fair_headroom`` of them are visited. So are the busy ones: all
        but those holding slots (the engine's batch size at most) are short by one or more."""
        kept = self._kept[tier].for_others(org, time.monotonic())
        if free_after >= self.policy.fair_headroom and free_after >= kept:
            return True
        held = self.held.get((tier, org), 0)
        if not held:
            return True  # an org's first request: it is under any share
        recent = self._recently_done(tier)  # first: forgetting orgs updates the count
        busy = self._busy[tier]  # ``org`` among them: it holds slots
        others = len(busy) - 1 + len(recent) - self._busy_recent[tier]
        if not others:
            return True  # alone: work-conserving
        tier_slots = self.policy.standard_cap if tier == "standard" else self.policy.size
        share = tier_slots / (others + 1)
        if held + weight <= share:
            return True
        if free_after < kept:
            return False  # slots another org just gave back are still its own
        short = 0  # what the others are short of their shares, counted up to the headroom
        for other in busy:
            if other != org:
                short += max(0, math.ceil(share - self.held.get((tier, other), 0)))
                if short >= self.policy.fair_headroom:
                    return False
        for other in recent:
            if other not in busy:
                short += math.ceil(share)
                if short >= self.policy.fair_headroom:
                    return False
        return free_after >= short

    def _recently_done(self, tier: str) -> OrderedDict[str, float]:
        """The tier's orgs done within ``recent_s``, oldest first: those done before are
        forgotten, from the front (as many steps as orgs forgotten)."""
        done = self._last_done[tier]
        cutoff = time.monotonic() - self.policy.recent_s
        while done and next(iter(done.values())) < cutoff:
            org, _ = done.popitem(last=False)
            if org in self._busy[tier]:
                self._busy_recent[tier] -= 1
        return done

    def _count_busy(self, tier: str, org: str) -> None:
        """``org``'s place among the tier's busy orgs, after its holding or line changed."""
        busy = self._busy[tier]
        now = org in self._queues[tier] or (tier, org) in self.held  # no zero counts held
        if now == (org in busy):
            return
        if now:
            busy.add(org)
        else:
            busy.discard(org)
        if org in self._last_done[tier]:
            self._busy_recent[tier] += 1 if now else -1

    def _push_turn(self, tier: str, org: str) -> None:
        """``org``'s turn as it stands now, if it waits."""
        line = self._queues[tier].get(org)
        if line:
            entry = (self.held.get((tier, org), 0), self._arrival[line[0]], org, line[0])
            heapq.heappush(self._turns[tier], entry)

    def has_room(self, tier: str, weight: int = 1, org: str | None = None) -> bool:
        """Whether a request of ``tier`` (of ``org``, where known) would get its slots now."""
        return self._allowed(tier, self._clamp(weight), org)

    def _clamp(self, weight: int) -> int:
        # A request larger than a tier may ever hold still runs, alone in its share.
        return max(1, min(weight, self.policy.standard_cap, self.policy.size))

    def try_take(self, tier: str, weight: int = 1, org: str = "") -> int | None:
        """The slots taken (``weight``, clamped), or None if the request must wait."""
        weight = self._clamp(weight)
        # Behind a waiting request of the same tier, a newcomer queues: the grant decides.
        if self.waiting(tier) or not self._allowed(tier, weight, org):
            return None
        self._hold(tier, org, weight)
        return weight

    def _hold(self, tier: str, org: str, slots: int) -> None:
        self.in_flight[tier] += slots
        held = self.held.get((tier, org), 0) + slots
        if held:
            self.held[(tier, org)] = held
        else:
            self.held.pop((tier, org), None)
        if slots > 0:
            self._kept[tier].take(org, slots)
        self._count_busy(tier, org)
        self._push_turn(tier, org)

    async def take(self, tier: Tier, max_wait_s: float, weight: int = 1, org: str = "") -> int:
        """Slots for a request of ``org`` of ``weight`` sequences of ``tier`` (the count
        taken, to give back), waiting at most ``max_wait_s``; else ``EngineBusy``."""
        taken = self.try_take(tier, weight, org)
        if taken is not None:
            return taken
        weight = self._clamp(weight)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        line = self._queues[tier].setdefault(org, deque())
        line.append(waiter)
        self._waiters[tier] += 1
        self._arrival[waiter] = next(self._arrivals)
        self._weights[waiter] = weight
        self._orgs[waiter] = org
        if len(line) == 1:  # the org's first waiter: its turn starts
            self._count_busy(tier, org)
            self._push_turn(tier, org)
        if sum(self.in_flight.values()) < self.policy.size:
            self._grant()  # free slots kept as headroom may be this newcomer's
        try:
            async with asyncio.timeout(max_wait_s):
                return await asyncio.shield(waiter)
        except TimeoutError:
            if waiter.done():  # granted as the wait ran out: keep it
                return waiter.result()
            self._give_up(tier, org, waiter)
            self._grant()  # it may have been the head of the line
            raise EngineBusy(tier, max_wait_s) from None
        except BaseException:
            # Cancelled (its client left), or its coroutine closed or interrupted: whatever
            # ends the wait, the request neither waits on nor holds what it was given.
            if waiter.done() and not waiter.cancelled():
                self.give_back(tier, waiter.result(), org)  # granted, but its request is gone
            else:
                self._give_up(tier, org, waiter)
                self._grant()
            raise
        finally:
            self._weights.pop(waiter, None)
            self._orgs.pop(waiter, None)

    def _give_up(self, tier: str, org: str, waiter: asyncio.Future[int]) -> None:
        """A waiter that stopped waiting (its time ran out, or its request went)."""
        if waiter.cancel():
            self._waiters[tier] -= 1
            self._drop_done(tier, org)

    def _drop_done(self, tier: str, org: str) -> None:
        """The org's first waiters that no longer wait leave its line (the line, if empty)."""
        line = self._queues[tier].get(org)
        if line is None or not line[0].done():
            return
        while line and line[0].done():
            self._arrival.pop(line.popleft(), None)
        if line:
            self._push_turn(tier, org)  # its next waiter's turn
        else:
            del self._queues[tier][org]
            self._count_busy(tier, org)

    def give_back(self, tier: str, taken: int, org: str = "") -> None:
        self._hold(tier, org, -taken)
        if self.policy.fair_headroom and self.policy.keep_s > 0:
            self._kept[tier].keep(org, taken, time.monotonic())
        done = self._last_done[tier]
        if org not in done and org in self._busy[tier]:
            self._busy_recent[tier] += 1
        done[org] = time.monotonic()
        done.move_to_end(org)  # oldest first: monotonic times, each org once
        # Every org that ever sent a request would stay otherwise (only the recent count).
        self._recently_done(tier)
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiters: standard first while below its floor, then fast."""
        while True:
            below_floor = self.in_flight["standard"] < self.policy.standard_floor
            order = TIERS[::-1] if below_floor else TIERS  # TIERS lists fast first
            for tier in order:
                waiter = self._grantable(tier)
                if waiter is not None:
                    org = self._orgs.get(waiter, "")
                    self._hold(tier, org, self._weights[waiter])
                    waiter.set_result(self._weights[waiter])
                    self._waiters[tier] -= 1
                    self._drop_done(tier, org)  # it was its org's first
                    break
            else:
                self._arm_regrant()
                return

    def _grantable(self, tier: str) -> asyncio.Future[int] | None:
        """The waiter of ``tier`` to get its slots now, if any: the earliest of the org
        holding the fewest. If its slots do not fit, nobody overtakes it; if only the
        headroom kept for other orgs holds it back, the next org's earliest may go."""
        # Between equal holdings, the org whose first waiting request came first: the heap's
        # order (arrivals are unique, so entries never compare further). Usually the first
        # true entry goes; one held back by headroom is set aside and put back after.
        turns, lines = self._turns[tier], self._queues[tier]
        if len(turns) > 2 * len(lines) + 64:  # mostly entries no longer true: rebuilt
            self._turns[tier] = turns = []
            for org in lines:
                self._push_turn(tier, org)
        held_back: list[tuple[int, int, str, asyncio.Future[int]]] = []
        try:
            while turns:
                held, _, org, waiter = turns[0]
                line = lines.get(org)
                if (
                    line is None
                    or line[0] is not waiter
                    or held != self.held.get((tier, org), 0)
                    or any(entry[2] == org for entry in held_back)
                ):
                    heapq.heappop(turns)  # no longer true (or a copy of one set aside)
                    continue
                weight = self._weights[waiter]
                left = self._fits(tier, weight)
                if left is None:
                    return None  # nobody overtakes it
                if self._leaves_headroom(tier, org, weight, left):
                    return waiter  # its entry is no longer true once it is granted
                held_back.append(heapq.heappop(turns))
            return None
        finally:
            for entry in held_back:
                heapq.heappush(turns, entry)

    def _arm_regrant(self) -> None:
        """Room kept for others is handed on once it is no longer theirs, not only at the
        next request's end: kept slots after ``keep_s``, headroom once the orgs it is kept
        for no longer count as active (``recent_s`` after their last request ended). A
        timer, while requests wait beside free slots."""
        if (
            not self.policy.fair_headroom
            or sum(self.in_flight.values()) >= self.policy.size
            or not any(self.waiting(t) for t in TIERS)
        ):
            return
        # The earliest of the tiers' oldest recent orgs stops counting first.
        due = [next(iter(done.values())) + self.policy.recent_s for t in TIERS
               if (done := self._recently_done(t))]  # fmt: skip
        now = time.monotonic()
        due += [end for t in TIERS if (end := self._kept[t].next_end(now)) is not None]
        if not due:
            return
        at = min(due)
        if self._regrant is not None:
            if self._regrant_at <= at:
                return
            self._regrant.cancel()  # something is handed on sooner
            self._regrant = None
        with contextlib.suppress(RuntimeError):  # no running loop: nobody waits on it
            self._regrant = asyncio.get_running_loop().call_later(
                max(at - time.monotonic(), 0.001), self._regrant_now
            )
            self._regrant_at = at

    def _regrant_now(self) -> None:
        self._regrant = None
        self._grant()
