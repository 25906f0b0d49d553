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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from serving.variants import VariantBook
from serving.vocabulary import STANDARD_MAX_SHARE, STANDARD_MIN_SHARE, TIERS, Tier


class EngineBusy(Exception):
    """No slot freed up within the tier's longest queue wait."""

    def __init__(self, tier: str, waited_s: float) -> None:
        super().__init__(f"the {tier} tier's engines stayed full for {waited_s:.0f}s")
        self.tier = tier


@dataclass(frozen=True)
class SlotPolicy:
    """How one engine's slots are shared (from serving/variants.yaml's ``admission``)."""

    #: The engine's batch size: requests in flight on it at most.
    size: int
    #: Whether both tiers use this engine.
    shared: bool
    standard_max_share: float = STANDARD_MAX_SHARE
    standard_min_share: float = STANDARD_MIN_SHARE
    #: Slots an org over its share of a tier leaves free for the tier's orgs under theirs
    #: (0: none, every freed slot goes to whoever waits).
    fair_headroom: int = 2
    #: How long after its last request ended an org still counts as active in a tier.
    recent_s: float = 1.0

    @property
    def standard_cap(self) -> int:
        return (
            self.size
            if not self.shared
            else max(1, math.floor(self.size * self.standard_max_share))
        )

    @property
    def standard_floor(self) -> int:
        return (
            0
            if not self.shared
            else min(self.standard_cap, math.ceil(self.size * self.standard_min_share))
        )


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
        self._regrant: asyncio.TimerHandle | None = None

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

    def _leaves_headroom(
        self, tier: str, org: str, weight: int, free_after: int, busy: set[str] | None = None
    ) -> bool:
        """False when ``org`` would take, over its share, the room kept for orgs under
        theirs (``fair_headroom`` slots at most, and no more than they are short);
        ``busy``: the tier's ``_busy_orgs``, where the caller has them.

        The tier's active orgs are the busy ones and those done within ``recent_s``. The
        recent ones may be thousands (every customer of the last second), so they are
        counted, not walked: each that is not busy holds nothing and is short of its whole
        share, so at most ``fair_headroom`` of them are visited."""
        if free_after >= self.policy.fair_headroom:
            return True
        held = self.held.get((tier, org), 0)
        if not held:
            return True  # an org's first request: it is under any share
        busy = self._busy_orgs(tier) if busy is None else busy  # ``org`` among them
        recent = self._recently_done(tier)
        others = len(busy) - 1 + len(recent) - sum(other in recent for other in busy)
        if not others:
            return True  # alone: work-conserving
        tier_slots = self.policy.standard_cap if tier == "standard" else self.policy.size
        share = tier_slots / (others + 1)
        if held + weight <= share:
            return True
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
            done.popitem(last=False)
        return done

    def _busy_orgs(self, tier: str) -> set[str]:
        """The tier's orgs holding slots or waiting for some (no more than the engine's
        slots and the requests waiting)."""
        busy = {org for t, org in self.held if t == tier}  # ``held`` keeps no zero counts
        busy.update(self._queues[tier])
        return busy

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

    async def take(self, tier: Tier, max_wait_s: float, weight: int = 1, org: str = "") -> int:
        """Slots for a request of ``org`` of ``weight`` sequences of ``tier`` (the count
        taken, to give back), waiting at most ``max_wait_s``; else ``EngineBusy``."""
        taken = self.try_take(tier, weight, org)
        if taken is not None:
            return taken
        weight = self._clamp(weight)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queues[tier].setdefault(org, deque()).append(waiter)
        self._waiters[tier] += 1
        self._arrival[waiter] = next(self._arrivals)
        self._weights[waiter] = weight
        self._orgs[waiter] = org
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
        except asyncio.CancelledError:
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
        if line is None:
            return
        while line and line[0].done():
            self._arrival.pop(line.popleft(), None)
        if not line:
            del self._queues[tier][org]

    def give_back(self, tier: str, taken: int, org: str = "") -> None:
        self._hold(tier, org, -taken)
        done = self._last_done[tier]
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
        # Between equal holdings, the org whose first waiting request came first.
        in_turn = sorted(
            ((org, line[0]) for org, line in self._queues[tier].items()),
            key=lambda item: (self.held.get((tier, item[0]), 0), self._arrival[item[1]]),
        )
        busy: set[str] | None = None
        for org, waiter in in_turn:
            weight = self._weights[waiter]
            left = self._fits(tier, weight)
            if left is None:
                return None
            if left < self.policy.fair_headroom and busy is None:
                busy = self._busy_orgs(tier)
            if self._leaves_headroom(tier, org, weight, left, busy):
                return waiter
        return None

    def _arm_regrant(self) -> None:
        """Headroom kept for orgs that went quiet is handed on once they no longer count
        as active (``recent_s`` after their last request ended), not only at the next
        request's end: a timer, while requests wait beside free slots."""
        if (
            not self.policy.fair_headroom
            or self._regrant is not None
            or sum(self.in_flight.values()) >= self.policy.size
            or not any(self.waiting(t) for t in TIERS)
        ):
            return
        # The earliest of the tiers' oldest recent orgs stops counting first.
        oldest = [next(iter(done.values())) for t in TIERS if (done := self._recently_done(t))]
        if not oldest:
            return
        delay = min(oldest) + self.policy.recent_s - time.monotonic()
        with contextlib.suppress(RuntimeError):  # no running loop: nobody waits on it
            self._regrant = asyncio.get_running_loop().call_later(
                max(delay, 0.001), self._regrant_now
            )

    def _regrant_now(self) -> None:
        self._regrant = None
        self._grant()


def share(total: int, worker: int, workers: int) -> int:
    """Worker ``worker``'s part of ``total`` split as evenly as whole units go (the first
    ``total % workers`` workers get one more); the parts add up to ``total``."""
    return total // workers + (1 if worker < total % workers else 0)


def slot_policies(
    urls_by_tier: Mapping[Tier, list[str]], book: VariantBook, profile: str
) -> dict[str, SlotPolicy]:
    """Each engine URL's slot policy: an engine both tiers use runs the ``shared`` variant,
    one tier's engine that tier's variant; its batch size is that variant's
    ``max-num-seqs`` under ``profile`` (no policy, so no limit, where it has none)."""
    tiers_of: dict[str, set[str]] = {}
    for tier, urls in urls_by_tier.items():
        for url in urls:
            tiers_of.setdefault(url, set()).add(tier)
    policies = {}
    for url, tiers in tiers_of.items():
        shared = len(tiers) > 1
        size = book.max_num_seqs("shared" if shared else next(iter(tiers)), profile)
        if size is not None:
            policies[url] = SlotPolicy(
                size,
                shared,
                book.slot_sharing.standard_max_share,
                book.slot_sharing.standard_min_share,
                book.slot_sharing.fair_headroom,
            )
    return policies
