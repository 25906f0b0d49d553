"""Keeping the reservations of requests in flight alive, in few Redis calls per process a tick.

A reservation expires ``reservation_ttl_s`` after it was made or last renewed: that is how
the budget gets back what a dead gateway held. A request may run longer than the TTL (a
long stream), so each process renews the reservations of its requests in flight every
third of the TTL, in script calls of up to ``RENEW_BATCH`` (on a Redis Cluster, one per
shard), until they are settled; one call's failure does not stop the others. The request
path only adds an entry at admission and removes it at settlement: no Redis round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

#: Reservations renewed per script call: a bounded time inside Redis per call.
RENEW_BATCH = 1000

RenewCall = Callable[[list[str], list[str]], Awaitable[Any]]


class Held(NamedTuple):
    """A named tuple: one is made per admitted request, at a third of a dataclass's cost."""

    key: str
    member: str
    #: ``time.monotonic()`` after which the entry is no longer renewed (a leak guard).
    until: float


class ReservationKeeper:
    def __init__(self, renew: RenewCall, ttl_s: int) -> None:
        self._renew = renew
        self.ttl_s = ttl_s
        self.interval_s = ttl_s / 3
        self._held: dict[str, Held] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, reservation_id: str, key: str, member: str, max_s: float | None) -> None:
        """Renew this reservation until ``release``, or until ``max_s`` plus one TTL."""
        until = math.inf if max_s is None else time.monotonic() + max_s + self.ttl_s
        self._held[reservation_id] = Held(key, member, until)
        if not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())

    def release(self, reservation_id: str) -> None:
        self._held.pop(reservation_id, None)

    async def renew_now(self) -> int:
        """Push every held reservation's expiry one TTL past Redis's now; how many moved."""
        now = time.monotonic()
        for reservation_id, held in list(self._held.items()):
            if held.until < now:
                # Its request outlived its maximum duration without settling: a bug
                # somewhere; letting the TTL release it bounds what it can hold.
                logger.error("reservation %s was never settled; no longer renewed", reservation_id)
                del self._held[reservation_id]
        entries = list(self._held.values())
        renewed = 0
        failure: Exception | None = None
        for start in range(0, len(entries), RENEW_BATCH):
            batch = entries[start : start + RENEW_BATCH]
            try:
                renewed += int(
                    await self._renew(
                        [held.key for held in batch],
                        [str(self.ttl_s), *(held.member for held in batch)],
                    )
                )
            except Exception as exc:  # the other batches are renewed all the same
                failure = failure or exc
        if failure is not None:
            raise failure
        return renewed

    async def _run(self) -> None:
        # Checked, not only cancelled: redis-py may turn a cancellation that lands inside a
        # command into an error of its own, which the handler below would then swallow.
        while not self._closed:
            await asyncio.sleep(self.interval_s)
            if not self._held:
                continue
            try:
                await self.renew_now()
            except Exception as exc:  # Redis away: the next tick is still within the TTL
                if not self._closed:
                    logger.warning("renewing %d reservations failed: %s", len(self._held), exc)

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
