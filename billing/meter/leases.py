"""Leases: a busy key's requests admitted in the gateway process, whatever their shapes,
against a slice of its rate limits and of its org's budget taken from Redis ahead.

Admission is one script call per request. Its Redis round trip is shared with the other
calls of the moment (``billing.redis.batching``), but its Python is not: naming the keys,
packing the call, reading the reply, the wake-ups. A *lease* is what one gateway process
holds for one key (and customer): requests and tokens charged to the key's rate limits,
and budget units reserved in its org's budget under the lease's own id, by one script
call (``LEASE``). A request that fits in what is left of it is admitted here without a
call or a wait: it takes one request, its tokens (prompt plus every output token it may
produce) and its worst case's list cost in budget units, and settles as any other,
releasing its part of the lease's reservation (``SETTLE``'s part). A request that does
not fit is admitted one at a time, as every request of a quiet key is.

What this changes, and its bounds:

- The budget is never overrun: a lease's units are reserved when it is granted, and a
  request takes its worst case's list cost, never less than what it can add to the
  budget (``budget_units``: a promotion's multiplier is at least 1).
- A lease is used until ``lifetime_s`` after the call that granted it, or last added to
  it, was sent; then what is left is given back (``RETURN_LEASE``: its units released,
  its requests and tokens refunded). So a suspension, or a budget spent by the org's
  other keys, reaches a busy key's requests at most ``lifetime_s`` late: a grant asked
  for after the suspension is refused, and the lease is given back at once.
- Only keys and orgs far from their limits get one. In one gateway process, what a key's
  leases hold unused (or have asked for) is at most ``1 / SHARE_OF_WHAT_IS_LEFT`` of the
  requests and tokens per minute it had left as last seen, and what an org's leases hold
  at most that share of what was left of its budget. Each process sees the others' in
  what Redis says is left, so N processes busy with one org hold at most 1 - (15/16)^N
  of what it had left (a sixteenth for one, 48% for ten): money the key's next requests
  take within the lifetime or give back. A key nearing a limit, or an org nearing its
  budget, is admitted one request at a time.
- Lost replies: a grant or a return whose reply is lost (a timeout) is sent again a
  second later; each applies once (``LEASE``'s grant number, ``RETURN_LEASE``'s mark). A
  lease's first grant lost twice is returned (a no-op if it was not made); a later one
  lost twice holds its units until the reservation's TTL, and its rate-limit charge.
- A refused admission (``RedisMeter``) gives back this process's leases of the org's
  budget (or the key's limits) and is tried again: no refusal stands while they hold it.
- Only busy keys: ``HOT_ARRIVALS`` requests of a key and customer in one lifetime in
  this process. A grant is for about a quarter of the requests they sent here in the
  last lifetime (between ``HOT_ARRIVALS`` and ``max_requests``), with twice their mean
  tokens and units each, and a next one is asked for once less than half of that is
  left, or half the lifetime has gone, so a steady key keeps its lease without a
  request waiting for it.
- A request admitted on a lease reports, in ``x-ratelimit-*``, what Redis said the key
  had left when the lease was last granted, plus what is left of the lease (and the
  resets as of that grant).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from billing import metrics
from billing.meter.keyspace import Keyspace
from billing.meter.lease_state import Holder, HolderKey, Lease, Waiting
from billing.meter.protocol import AdmissionRequest
from billing.meter.reservations import ReservationKeeper
from billing.meter.scripts import LEASE, RETURN_LEASE
from billing.prices.periods import period_bounds
from billing.prices.pricing import PriceBook
from billing.redis.batching import Script, ScriptBatcher
from billing.redis.cluster import ClusterScripts

logger = logging.getLogger(__name__)

LEASE_SCRIPT = Script(LEASE)
RETURN_LEASE_SCRIPT = Script(RETURN_LEASE)

#: What a key's leases hold unused (and an org's, over its keys) is at most this fraction
#: of what it had left as last seen.
SHARE_OF_WHAT_IS_LEFT = 16
#: Requests of a key within one lifetime that make it busy enough for a lease.
HOT_ARRIVALS = 4
#: Keys (with customers) tracked per process; past it, new ones are admitted one at a time.
MAX_HOLDERS = 10_000


class Leases:
    """``take(request, units)``: the lease the request is admitted on, or None (admit it
    alone). ``settled(lease)`` once a request taken on it has settled."""

    def __init__(
        self,
        scripts: ScriptBatcher | ClusterScripts,
        keys: Keyspace,
        book: PriceBook,
        keeper: ReservationKeeper,
        *,
        period: Callable[[], str],
        max_requests: int,
        lifetime_s: float,
        reservation_ttl_s: int,
    ) -> None:
        self._scripts = scripts
        self._keys = keys
        self._book = book
        self._keeper = keeper
        self._period = period
        self.max_requests = max_requests
        self.lifetime_s = lifetime_s
        self._reservation_ttl_s = reservation_ttl_s
        self._holders: dict[HolderKey, Holder] = {}
        self._keys_waiting: dict[str, Waiting] = {}
        self._orgs_waiting: dict[str, Waiting] = {}
        self._ids = itertools.count()
        #: Ids unique to this process: the reservations of every gateway share a hash.
        self._prefix = f"lease-{uuid.uuid4().hex[:12]}-"
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._forgot_at = -math.inf
        self._admitted = metrics.admission_leases.labels("admitted")
        self._granted = metrics.admission_leases.labels("granted")
        self._returned = metrics.admission_leases.labels("returned")

    def take(self, request: AdmissionRequest, units_of: Callable[[], int | None]) -> Lease | None:
        """The lease ``request`` is admitted on, its part taken (``units_of()``: its worst
        case's list cost, asked only of a busy key; None: it cannot be priced), or None."""
        if not self.max_requests or self._closed:
            return None
        key = (request.org_id, request.key_id, request.plan, request.customer_id)
        holder = self._holders.get(key) or self._track(key)
        if holder is None:
            return None
        now = time.monotonic()
        if now - holder.window_start > self.lifetime_s:
            holder.window_start, holder.last_rate, holder.arrivals = now, holder.arrivals, 0
        holder.arrivals += 1
        hot = max(holder.arrivals, holder.last_rate) >= HOT_ARRIVALS
        tokens = request.prompt_tokens + request.max_output_tokens
        lease = holder.lease
        taken = None
        units = 0
        if hot or lease is not None:
            priced = units_of()
            if priced is None:  # admission alone refuses it
                return None
            units = priced
            # Running means (integers: they only size grants), from the first request.
            if holder.mean_tokens:
                holder.mean_tokens += (tokens - holder.mean_tokens) // 8
                holder.mean_units += (units - holder.mean_units) // 8
            else:
                holder.mean_tokens, holder.mean_units = tokens, units
        if lease is not None and (lease.expires <= now or lease.period != self._period()):
            if not holder.asking:  # else the grant on its way retires it
                self._retire(holder)
            lease = None
        if lease is not None and lease.requests and lease.tokens >= tokens and lease.units >= units:
            lease.requests -= 1
            lease.tokens -= tokens
            lease.units -= units
            lease.in_flight += 1
            holder.key.add(-1, -tokens, 0)
            holder.org.add(0, 0, -units)
            self._admitted.inc()
            taken = lease
            self._hold_for(lease, now, request.max_duration_s)
        if (
            hot
            and not holder.asking
            and (
                lease is None
                or lease.requests * 2 < holder.size
                or lease.tokens < 2 * holder.mean_tokens
                or lease.units < 2 * holder.mean_units
                or lease.expires - now < self.lifetime_s / 2
            )
        ):
            self._ask(key, holder)
        return taken

    def _hold_for(self, lease: Lease, now: float, max_duration_s: float | None) -> None:
        """Keep the lease's reservation renewed while a request taken on it may run: until
        its maximum duration (plus a TTL), then no longer, so that a request that never
        settles cannot hold the money for ever."""
        until = math.inf if max_duration_s is None else now + max_duration_s
        if until > lease.held_until:
            # Pushed a lifetime further than needed: one keeper update per lifetime.
            lease.held_until = until + self.lifetime_s
            self._keeper.hold(
                lease.reservation_id, lease.resv_key, lease.member, lease.held_until - now
            )

    def settled(self, lease: Lease) -> None:
        """A request admitted on ``lease`` has settled (its part released by the settlement)."""
        lease.in_flight -= 1
        if lease.retired and not lease.in_flight:
            self._keeper.release(lease.reservation_id)

    def admitted(
        self, request: AdmissionRequest, *, left_requests: int, left_tokens: int, left_budget: int
    ) -> None:
        """A request was admitted one at a time: what its admission said was left."""
        key = self._keys_waiting.get(request.key_id)
        if key is not None:
            key.left_requests, key.left_tokens = left_requests, left_tokens
        org = self._orgs_waiting.get(request.org_id)
        if org is not None:
            org.left_budget = left_budget

    def _track(self, key: HolderKey) -> Holder | None:
        if len(self._holders) >= MAX_HOLDERS:
            # Looked over at most once a lifetime: every holder busy, nothing to forget.
            now = time.monotonic()
            if now - self._forgot_at < self.lifetime_s:
                return None
            self._forgot_at = now
            if not self._forget_idle():
                return None
        key_waiting = self._keys_waiting.setdefault(key[1], Waiting())
        org_waiting = self._orgs_waiting.setdefault(key[0], Waiting())
        key_waiting.holders += 1
        org_waiting.holders += 1
        holder = self._holders[key] = Holder(key, time.monotonic(), key_waiting, org_waiting)
        return holder

    def _forget_idle(self) -> bool:
        """Room for a new holder: those with no lease and no grant on its way forgotten
        (with their keys and orgs, once no holder counts there)."""
        for key, holder in list(self._holders.items()):
            if holder.lease is not None or holder.asking:
                continue
            if holder.timer is not None:
                holder.timer.cancel()
            del self._holders[key]
            for table, name, waiting in (
                (self._keys_waiting, key[1], holder.key),
                (self._orgs_waiting, key[0], holder.org),
            ):
                waiting.holders -= 1
                if not waiting.holders:
                    del table[name]
        return len(self._holders) < MAX_HOLDERS

    def _ask(self, key: HolderKey, holder: Holder) -> None:
        """Ask for a grant sized for the key's pace, within the key's and the org's share
        of what they have left (counted as waiting from now: concurrent grants of the
        key's or the org's other holders see it)."""
        share = SHARE_OF_WHAT_IS_LEFT
        each_tokens, each_units = max(1, holder.mean_tokens), max(1, holder.mean_units)
        rate = max(holder.arrivals, holder.last_rate)
        count = min(
            self.max_requests,
            max(HOT_ARRIVALS, rate // 4),
            holder.key.left_requests // share - holder.key.count,
        )
        tokens = min(2 * count * each_tokens, holder.key.left_tokens // share - holder.key.tokens)
        units = min(2 * count * each_units, holder.org.left_budget // share - holder.org.units)
        if count < 2 or tokens < 2 * each_tokens or units < 2 * each_units:
            return
        period = holder.lease.period if holder.lease is not None else self._period()
        # Never past the month's end (by this gateway's clock: Redis's names the period),
        # where the lease's units are reserved; its lease expires on its own.
        if (period_bounds(period)[1] - datetime.now(UTC)).total_seconds() < self.lifetime_s:
            return
        holder.asking = True
        holder.key.add(count, tokens, 0)
        holder.org.add(0, 0, units)
        self._spawn(self._grant(key, holder, period, (count, tokens, units)))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _grant(
        self, key: HolderKey, holder: Holder, period: str, amounts: tuple[int, int, int]
    ) -> None:
        """Add ``amounts`` (requests, tokens, units) to the key's lease (a new one if it has
        none), counted as waiting by ``_ask``: what is not granted is taken off."""
        org_id, key_id, plan_name, customer_id = key
        count, tokens, units = amounts
        lease = holder.lease or Lease(f"{self._prefix}{next(self._ids)}", period)
        granted = lost = False
        try:
            plan = self._book.plan(plan_name)
            args: list[str | int] = [plan.rpm, plan.tpm, count, tokens, units]
            args += [plan.period_cap_nano, lease.member, self._reservation_ttl_s]
            args += [lease.period, lease.grants + 1]
            call = (self._keys.admission_keys(org_id, key_id, customer_id, lease.period), args)
            # Counted from before the call: a slow reply does not stretch the lifetime.
            sent_at = time.monotonic()
            try:
                reply = await self._scripts.call(LEASE_SCRIPT, *call)
            except Exception as exc:  # sent once more: a grant applied before is not again
                logger.warning("leasing admissions failed, asking again: %s", exc)
                lost = True
                await asyncio.sleep(1.0)
                reply = await self._scripts.call(LEASE_SCRIPT, *call)
            lost = False
            if reply[0] not in (b"ok", b"again"):  # one at a time until an admission says
                holder.key.left_requests = holder.key.left_tokens = holder.org.left_budget = 0
                return
            granted = True
            lease.rpm, lease.tpm = plan.rpm, plan.tpm
            if reply[0] == b"ok" or not lease.template:  # "again": figures of the last reply
                lease.granted(reply if reply[0] == b"ok" else [b"", 0, 0, 0, 0, b"", 0])
                holder.key.left_requests = lease.left_requests
                holder.key.left_tokens = lease.left_tokens
                holder.org.left_budget = lease.left_budget
            lease.requests += count
            lease.tokens += tokens
            lease.units += units
            lease.expires = sent_at + self.lifetime_s
            lease.grants += 1
            holder.size = count
            holder.lease = lease
            self._granted.inc()
            if lease.grants == 1:
                # Renewed while it lives or a request taken on it runs (the reservation's
                # TTL gives it back if this process dies).
                lease.resv_key = f"{self._keys.budget_prefix(org_id)}{lease.period}:resv"
                self._keeper.hold(lease.reservation_id, lease.resv_key, lease.member, None)
        except Exception as exc:
            # Redis away, slow or refusing. A lease's first grant whose reply was lost twice
            # is returned (a no-op if it was not made); a later one's units go back with
            # the reservation's TTL, once the lease is no longer renewed.
            logger.warning("leasing admissions failed: %s", exc)
            holder.key.left_requests = holder.key.left_tokens = holder.org.left_budget = 0
        finally:
            if not granted:
                holder.key.add(-count, -tokens, 0)
                holder.org.add(0, 0, -units)
            holder.asking = False
        if lost and not lease.grants:
            lease.rpm, lease.tpm = plan.rpm, plan.tpm
            self._spawn(self._return(holder, lease, count, tokens, units))
        if holder.lease is None:
            return
        if self._closed or holder.lease.expires <= time.monotonic() or not granted:
            self._retire(holder)  # a refusal: given back at once
        else:
            self._arm(key, holder)

    def _arm(self, key: HolderKey, holder: Holder) -> None:
        """One timer per holder, due when its lease expires (a grant moves it later)."""
        if holder.timer is not None:
            holder.timer.cancel()
        lease = holder.lease
        if lease is not None and not self._closed:
            wait_s = max(0.0, lease.expires - time.monotonic()) + 0.01
            holder.timer = asyncio.get_running_loop().call_later(wait_s, self._expired, key, holder)

    def _expired(self, key: HolderKey, holder: Holder) -> None:
        holder.timer = None
        if self._closed or self._holders.get(key) is not holder or holder.asking:
            return  # forgotten since, or the grant on its way retires or re-arms it
        lease = holder.lease
        if lease is not None and lease.expires <= time.monotonic():
            self._retire(holder)
        else:
            self._arm(key, holder)

    async def give_back(self, request: AdmissionRequest, *, budget: bool) -> bool:
        """Give back, and wait for, what this process's leases hold of ``request``'s org's
        budget (``budget``), else of its key's rate limits: a refusal is not left standing
        while they hold it. No lease is asked for the key or org until an admission says
        there is room. Whether anything was given back."""
        if budget:
            waiting = self._orgs_waiting.get(request.org_id)
            if waiting is None or not waiting.units:
                return False
            waiting.left_budget = 0
            holders = [holder for holder in self._holders.values() if holder.org is waiting]
        else:
            waiting = self._keys_waiting.get(request.key_id)
            if waiting is None or not (waiting.count or waiting.tokens):
                return False
            waiting.left_requests = waiting.left_tokens = 0
            holders = [holder for holder in self._holders.values() if holder.key is waiting]
        returns = [self._retire(holder) for holder in holders if not holder.asking]
        sent = [task for task in returns if task is not None]
        if not sent:
            return False
        # Shielded: a client that hangs up meanwhile does not cancel the returns.
        await asyncio.shield(asyncio.gather(*sent))
        return True

    def _retire(self, holder: Holder) -> asyncio.Task[None] | None:
        """Give the holder's lease back: what is left unused, at once (the call doing it)."""
        lease, holder.lease = holder.lease, None
        if lease is None or lease.retired:
            return None
        lease.retired = True
        if holder.timer is not None:
            holder.timer.cancel()
            holder.timer = None
        requests, tokens, units = lease.requests, lease.tokens, lease.units
        lease.requests = lease.tokens = lease.units = 0
        holder.key.add(-requests, -tokens, 0)
        holder.org.add(0, 0, -units)
        if not lease.in_flight:
            self._keeper.release(lease.reservation_id)
        if not (requests or tokens or units):
            return None
        return self._spawn(self._return(holder, lease, requests, tokens, units))

    async def _return(
        self, holder: Holder, lease: Lease, requests: int, tokens: int, units: int
    ) -> None:
        """``RETURN_LEASE``, sent once more a second later if it fails (it applies once)."""
        org_id, key_id = holder.id[0], holder.id[1]
        budget = f"{self._keys.budget_prefix(org_id)}{lease.period}"
        keys = [self._keys.ratelimit(org_id, key_id), budget, f"{budget}:resv"]
        keys.append(f"{budget}:resv-amount")
        args: list[str | int] = [lease.rpm, lease.tpm, requests, tokens, units, lease.member]
        for again in (False, True):
            try:
                if again:
                    await asyncio.sleep(1.0)
                returned = await self._scripts.call(RETURN_LEASE_SCRIPT, keys, args)
            except Exception as exc:
                # Twice: its units go back with the reservation's TTL, its requests and
                # tokens are not refunded.
                logger.warning("returning a lease failed: %s", exc)
            else:
                self._returned.inc(int(returned))
                return

    async def aclose(self) -> None:
        """Give back every lease (once the grants on their way are back)."""
        self._closed = True
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for holder in self._holders.values():
            self._retire(holder)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._holders.clear()
        self._keys_waiting.clear()
        self._orgs_waiting.clear()
