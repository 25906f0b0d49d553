"""Admissions made ahead: a busy key's next requests admitted in one Redis call.

Admission is one script call per request. Its Redis round trip is shared with the other
calls of the moment (``billing.batching``), but its Python is not: naming the keys,
packing the call, reading the reply, the wake-ups. A key that sends the same shape of
request many times a second, far from its limits, has its next ones admitted here ahead
of their arrival, ``batch`` at a time, by ``ADMIT_AHEAD``: the admission script itself,
run once per admission, each with its own rate-limit charge, its own budget reservation
(under an id of its own) and its own ``x-ratelimit-*`` figures. A request that arrives
takes one (``take``) without a call or a wait and settles it as any other (the
settlement releases the reservation by that id).

A request's *shape* is its key, org, plan, tier, model and customer, with its prompt and
output tokens each rounded up to four significant bits (at most an eighth more): the
admissions made ahead are sized for the largest request of the shape, so any request of
it fits the reservation and the rate-limit charge made for it.

What this changes, and its bounds:

- An admission is made up to ``lifetime_s`` before its request arrives. Unused for that
  long, it is given back (``RELEASE_AHEAD``: its reservation released, its rate-limit
  charge refunded), so a suspension, or a budget spent by the org's other keys, reaches
  a busy key's requests up to ``lifetime_s`` late. The budget is never overrun by it:
  the money of every admission made ahead is reserved when it is made. Nor does one
  outlive a change of price or promotion (its reservation was priced before it).
- Only keys and orgs far from their limits get them. What a key has waiting, over all
  its shapes, is at most ``1 / SHARE_OF_WHAT_IS_LEFT`` of the requests and tokens per
  minute it had left when they were made (as its last admission said), and what an org
  has waiting, over all its keys, that share of what was left of its budget: so
  admissions made ahead never stand in the way of the org's other requests for more than
  that share of what was left when they were made (until they are taken or given
  back), and a key
  nearing a limit, or an org nearing its budget, is admitted one request at a time as
  before. A new batch is asked for while fewer than a batch are left, so the pool does
  not run dry under a steady load (its requests would wait behind it).
- Only busy shapes: ``HOT_ARRIVALS`` of its requests within one lifetime.
- Requests taking them are charged their shape's tokens (an eighth more at most) and
  report the rate-limit figures of when they were made.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, NamedTuple

from billing import metrics
from billing.batching import Script, ScriptBatcher
from billing.cluster import ClusterScripts
from billing.headers import ratelimit_headers
from billing.keyspace import Keyspace
from billing.lua import ADMIT_AHEAD, RELEASE_AHEAD
from billing.meter import AdmissionRequest
from billing.pricing import PriceBook, worst_case_charge

logger = logging.getLogger(__name__)

ADMIT_AHEAD_SCRIPT = Script(ADMIT_AHEAD)
RELEASE_AHEAD_SCRIPT = Script(RELEASE_AHEAD)

#: What a key has waiting (and an org, over its keys) is at most this fraction of what its
#: last admission said was left: the margin that keeps a key or an org near a limit on
#: one-at-a-time admission, and the most that admissions made ahead may hold back.
SHARE_OF_WHAT_IS_LEFT = 16
#: Requests of a shape within one lifetime that make it busy enough to admit ahead.
HOT_ARRIVALS = 4
#: Shapes (and keys, and orgs) tracked per process; past it, new ones are admitted one at
#: a time.
MAX_SHAPES = 10_000


def round_up(tokens: int) -> int:
    """``tokens`` rounded up to four significant bits: at most an eighth more."""
    if tokens <= 16:
        return tokens
    shift = tokens.bit_length() - 4
    return -(-tokens >> shift) << shift


Shape = tuple[str, str, str, str, str, str | None, int, int]


def shape_of(request: AdmissionRequest) -> Shape:
    return (
        request.org_id,
        request.key_id,
        request.plan,
        request.tier,
        request.model,
        request.customer_id,
        round_up(request.prompt_tokens),
        round_up(request.max_output_tokens),
    )


class Ahead(NamedTuple):
    """One admission made ahead, waiting for a request of its shape."""

    #: The reservation's id in the budget of ``period`` (what the settlement releases).
    member: str
    period: str
    headers: dict[str, str]
    reserved_nano_usd: int
    #: Requests like it that still fit after it, as ``Admission.headroom``.
    headroom: int
    #: ``time.monotonic()`` after which no request takes it.
    expires: float


class _ShapeState:
    __slots__ = ("arrivals", "entries", "refilling", "window_start", "worst")

    def __init__(self, now: float, worst: int) -> None:
        self.entries: deque[Ahead] = deque()
        self.window_start = now
        self.arrivals = 0
        self.refilling = False
        #: The reservation of one of its admissions made ahead (as last priced).
        self.worst = worst


class _Waiting:
    """A key's (or an org's) admissions made ahead and not yet taken, and what its last
    admission said it had left."""

    __slots__ = ("count", "left_budget", "left_requests", "left_tokens", "nano", "tokens")

    def __init__(self) -> None:
        self.count = self.tokens = self.nano = 0
        self.left_requests = self.left_tokens = self.left_budget = 0

    def add(self, count: int, tokens: int, nano: int) -> None:
        self.count += count
        self.tokens += tokens
        self.nano += nano


class AdmissionsAhead:
    """``take(request)``: an admission made ahead for it, or None (admit it as usual)."""

    def __init__(
        self,
        scripts: ScriptBatcher | ClusterScripts,
        keys: Keyspace,
        book: PriceBook,
        *,
        period: Callable[[], str],
        batch: int,
        lifetime_s: float,
        reservation_ttl_s: int,
    ) -> None:
        self._scripts = scripts
        self._keys = keys
        self._book = book
        self._period = period
        self.batch = batch
        self.lifetime_s = lifetime_s
        self._reservation_ttl_s = reservation_ttl_s
        self._shapes: dict[Shape, _ShapeState] = {}
        #: Per key (its requests and tokens) and per org (its money) what is waiting.
        self._keys_waiting: dict[str, _Waiting] = {}
        self._orgs_waiting: dict[str, _Waiting] = {}
        self._ids = itertools.count()
        #: Ids unique to this process: the reservations of every gateway share a hash.
        self._prefix = f"ahead-{uuid.uuid4().hex[:12]}-"
        self._tasks: set[asyncio.Task[None]] = set()
        self._taken = metrics.admissions_ahead.labels("taken")
        self._released = metrics.admissions_ahead.labels("released")

    def take(self, request: AdmissionRequest) -> Ahead | None:
        if not self.batch:
            return None
        shape = shape_of(request)
        state = self._shapes.get(shape)
        now = time.monotonic()
        if state is None:
            if len(self._shapes) >= MAX_SHAPES and not self._forget_idle():
                return None
            state = self._shapes[shape] = _ShapeState(now, 0)
        if now - state.window_start > self.lifetime_s:
            state.window_start, state.arrivals = now, 0
        state.arrivals += 1
        entries = state.entries
        if entries and entries[0].expires < now:
            self._expire(shape)
        taken = None
        if entries:
            taken = entries.popleft()
            self._gone(shape, 1, taken.reserved_nano_usd)
            self._taken.inc()
        if not state.refilling and state.arrivals >= HOT_ARRIVALS and len(entries) < self.batch:
            count = self._room(shape, state)
            if count >= 2:
                state.refilling = True
                self._spawn(self._admit_ahead(shape, state, count))
        return taken

    def admitted(
        self,
        request: AdmissionRequest,
        *,
        left_requests: int,
        left_tokens: int,
        left_budget: int,
        worst: int,
    ) -> None:
        """A request was admitted one at a time: what its admission said was left."""
        shape = shape_of(request)
        state = self._shapes.get(shape)
        if state is None:
            return
        state.worst = state.worst or worst
        key = self._waiting(self._keys_waiting, request.key_id)
        org = self._waiting(self._orgs_waiting, request.org_id)
        if key is not None and org is not None:
            key.left_requests, key.left_tokens = left_requests, left_tokens
            org.left_budget = left_budget

    def _room(self, shape: Shape, state: _ShapeState) -> int:
        """How many more of the shape may be admitted ahead now (see the module docstring)."""
        key = self._keys_waiting.get(shape[1])
        org = self._orgs_waiting.get(shape[0])
        if key is None or org is None:
            return 0
        share = SHARE_OF_WHAT_IS_LEFT
        tokens = max(1, shape[6] + shape[7])
        room = min(
            self.batch,
            key.left_requests // share - key.count,
            (key.left_tokens // share - key.tokens) // tokens,
        )
        if state.worst > 0:
            room = min(room, (org.left_budget // share - org.nano) // state.worst)
        return room

    def _waiting(self, table: dict[str, _Waiting], name: str) -> _Waiting | None:
        waiting = table.get(name)
        if waiting is None:
            if len(table) >= MAX_SHAPES:
                for other in [n for n, w in table.items() if not w.count]:  # none waiting
                    del table[other]
                if len(table) >= MAX_SHAPES:
                    return None
            waiting = table[name] = _Waiting()
        return waiting

    def _gone(self, shape: Shape, count: int, nano: int) -> None:
        """``count`` of the shape's admissions (``nano`` in all) are no longer waiting."""
        self._keys_waiting[shape[1]].add(-count, -count * (shape[6] + shape[7]), 0)
        self._orgs_waiting[shape[0]].add(-count, 0, -nano)

    def _forget_idle(self) -> bool:
        """Room for a new shape: the shapes with nothing waiting or on its way forgotten."""
        for shape, state in list(self._shapes.items()):
            if not state.entries and not state.refilling:
                del self._shapes[shape]
        return len(self._shapes) < MAX_SHAPES

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _admit_ahead(self, shape: Shape, state: _ShapeState, count: int) -> None:
        org_id, key_id, plan_name, tier, model, customer_id, prompt, output = shape
        key = self._keys_waiting[key_id]
        org = self._orgs_waiting[org_id]
        try:
            plan = self._book.plan(plan_name)
            made_at = datetime.now(UTC)
            worst = worst_case_charge(
                self._book,
                tier=tier,  # type: ignore[arg-type]
                model=model,
                prompt_tokens=prompt,
                max_output_tokens=output,
                at=made_at,
            ).allowance_consumed_nano
            state.worst = worst
            lifetime_s = self.lifetime_s
            change = self._book.next_change_after(made_at)
            if change is not None:
                lifetime_s = min(lifetime_s, (change - made_at).total_seconds())
            period = self._period()
            budget = f"{self._keys.budget_prefix(org_id)}{period}"
            members = [f"{self._prefix}{next(self._ids)}" for _ in range(count)]
            replies = await self._scripts.call(
                ADMIT_AHEAD_SCRIPT,
                [
                    self._keys.ratelimit(org_id, key_id),
                    self._keys.suspended_org(org_id),
                    self._keys.suspended_customer(org_id, customer_id or ""),
                    budget,
                    f"{budget}:resv",
                    f"{budget}:resv-amount",
                ],
                [
                    plan.rpm,
                    plan.tpm,
                    prompt + output,
                    worst,
                    plan.period_cap_nano,
                    "",
                    self._reservation_ttl_s,
                    period,
                    *members,
                ],
            )
            expires = time.monotonic() + lifetime_s
            made = 0
            for member, reply in zip(members, replies, strict=False):
                if reply[0] != b"ok":  # a refusal: one at a time until an admission says
                    key.left_requests = key.left_tokens = org.left_budget = 0
                    break
                left_requests, left_tokens, left_budget = (
                    int(reply[1]),
                    int(reply[3]),
                    int(reply[6]),
                )
                key.left_requests, key.left_tokens = left_requests, left_tokens
                org.left_budget = left_budget
                headers = ratelimit_headers(
                    rpm=plan.rpm,
                    tpm=plan.tpm,
                    remaining_requests=left_requests,
                    reset_requests_us=int(reply[2]),
                    remaining_tokens=left_tokens,
                    reset_tokens_us=int(reply[4]),
                )
                headroom = min(
                    left_requests,
                    left_tokens // (prompt + output or 1),
                    left_budget // worst if worst > 0 else left_requests,
                )
                state.entries.append(Ahead(member, period, headers, worst, headroom, expires))
                made += 1
            key.add(made, made * (prompt + output), 0)
            org.add(made, 0, made * worst)
            if made:
                asyncio.get_running_loop().call_later(lifetime_s, self._expire, shape)
        except Exception as exc:  # Redis away or refusing: requests are admitted one by one
            logger.debug("admitting ahead failed: %s", exc)
            key.left_requests = key.left_tokens = org.left_budget = 0
        finally:
            state.refilling = False

    def _expire(self, shape: Shape) -> None:
        """Give back the shape's admissions past their lifetime."""
        state = self._shapes.get(shape)
        if state is None:
            return
        now = time.monotonic()
        stale: list[Ahead] = []
        while state.entries and state.entries[0].expires <= now:
            stale.append(state.entries.popleft())
        if stale:
            self._gone(shape, len(stale), sum(entry.reserved_nano_usd for entry in stale))
            self._spawn(self._release(shape, stale))
        if state.entries:  # a later batch's (or a timer that fired early): looked at again
            wait_s = state.entries[0].expires - now + 0.01
            asyncio.get_running_loop().call_later(wait_s, self._expire, shape)

    async def _release(self, shape: Shape, entries: list[Ahead]) -> None:
        org_id, key_id, plan_name, *_, prompt, output = shape
        for period in {entry.period for entry in entries}:
            budget = f"{self._keys.budget_prefix(org_id)}{period}"
            members = [entry.member for entry in entries if entry.period == period]
            try:
                plan = self._book.plan(plan_name)
                released = await self._scripts.call(
                    RELEASE_AHEAD_SCRIPT,
                    [
                        self._keys.ratelimit(org_id, key_id),
                        budget,
                        f"{budget}:resv",
                        f"{budget}:resv-amount",
                    ],
                    [plan.rpm, plan.tpm, prompt + output, *members],
                )
            except Exception as exc:  # held until the reservation's TTL releases it
                logger.warning("giving back %d admissions made ahead failed: %s", len(members), exc)
            else:
                self._released.inc(int(released))

    async def aclose(self) -> None:
        """Give back every admission made ahead, once those on their way are made."""
        self.batch = 0
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for shape, state in list(self._shapes.items()):
            if state.entries:
                entries = list(state.entries)
                state.entries.clear()
                await self._release(shape, entries)
        self._shapes.clear()
        self._keys_waiting.clear()
        self._orgs_waiting.clear()
