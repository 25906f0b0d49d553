"""Admissions made ahead: a busy key's next requests admitted in one Redis call.

Admission is one script call per request. Its Redis round trip is shared with the other
calls of the moment (``billing.redis.batching``), but its Python is not: naming the keys,
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
  outlive a change of price or promotion (its reservation was priced before it), or its
  month (its money is reserved in that month's budget).
- Only keys and orgs far from their limits get them. In one gateway process, what a key
  has waiting (asked for or made, over all its shapes) is at most
  ``1 / SHARE_OF_WHAT_IS_LEFT`` of the requests and tokens per minute its last admission
  said it had left, and what an org has waiting, over all its keys, at most that share
  of what was left of its budget. Each process sees the others' in what Redis says is
  left, so N processes busy with one org hold at most 1 - (15/16)^N of what it had left
  (a sixteenth for one, 12% for two, 48% for ten), money its busy keys' next requests
  take within the lifetime or give back. A key nearing a limit, or an org nearing its
  budget, is admitted one request at a time as before. A new batch is asked for while
  fewer than a batch are left, so the pool does not run dry under a steady load (its
  requests would wait behind it).
- Only busy shapes: ``HOT_ARRIVALS`` of its requests within one lifetime.
- Requests taking them are charged their shape's tokens (an eighth more at most) and
  report the rate-limit figures of when they were made.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, NamedTuple

from billing import metrics
from billing.meter.keyspace import Keyspace
from billing.meter.protocol import AdmissionRequest
from billing.meter.ratelimit_headers import admission_headers
from billing.meter.scripts import ADMIT_AHEAD, RELEASE_AHEAD
from billing.prices.periods import period_bounds
from billing.prices.pricing import Charge, PriceBook, PriceBookError, worst_case_charge
from billing.redis.batching import Script, ScriptBatcher
from billing.redis.cluster import ClusterScripts

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


def headroom(
    left_requests: int, left_tokens: int, left_budget: int, tokens: int, worst: int
) -> int:
    """About how many more requests of ``tokens`` and ``worst`` nano-USD fit in what an
    admission said was left (``Admission.headroom``)."""
    by_budget = left_budget // worst if worst > 0 else left_requests
    return min(left_requests, left_tokens // max(1, tokens), by_budget)


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
    #: What Redis holds for it (budget units: billing.meter.scripts).
    reserved_nano_usd: int
    #: What its org counts as waiting for it: the shape's worst allowance cost when made.
    counted_nano: int
    #: Requests like it that still fit after it, as ``Admission.headroom``.
    headroom: int
    #: ``time.monotonic()`` after which no request takes it.
    expires: float


class _Waiting:
    """A key's (or an org's) admissions made ahead and not yet taken, counted from when
    they are asked for, and what its last admission said it had left."""

    __slots__ = ("count", "left_budget", "left_requests", "left_tokens", "nano", "shapes", "tokens")

    def __init__(self) -> None:
        self.count = self.tokens = self.nano = 0
        self.left_requests = self.left_tokens = self.left_budget = 0
        #: Tracked shapes that count here: it is forgotten with the last of them.
        self.shapes = 0

    def add(self, count: int, tokens: int, nano: int) -> None:
        self.count += count
        self.tokens += tokens
        self.nano += nano


class _ShapeState:
    __slots__ = ("arrivals", "entries", "key", "org", "refilling", "timer", "window_start", "worst")

    def __init__(self, now: float, key: _Waiting, org: _Waiting) -> None:
        self.entries: deque[Ahead] = deque()
        self.window_start = now
        self.arrivals = 0
        self.refilling = False
        #: The reservation of one admission made ahead of the shape (0: not priced yet).
        self.worst = 0
        self.key, self.org = key, org
        #: The one timer that gives back what expires (None: none pending).
        self.timer: asyncio.TimerHandle | None = None


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
        #: What waits per key (its requests and tokens) and per org (its money).
        self._keys_waiting: dict[str, _Waiting] = {}
        self._orgs_waiting: dict[str, _Waiting] = {}
        self._ids = itertools.count()
        #: Ids unique to this process: the reservations of every gateway share a hash.
        self._prefix = f"ahead-{uuid.uuid4().hex[:12]}-"
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: When ``_forget_idle`` last looked over the shapes.
        self._forgot_at = -math.inf
        self._taken = metrics.admissions_ahead.labels("taken")
        self._released = metrics.admissions_ahead.labels("released")

    def take(self, request: AdmissionRequest) -> Ahead | None:
        if not self.batch or self._closed:
            return None
        shape = shape_of(request)
        state = self._shapes.get(shape) or self._track(shape)
        if state is None:
            return None
        now = time.monotonic()
        if now - state.window_start > self.lifetime_s:
            state.window_start, state.arrivals = now, 0
        state.arrivals += 1
        entries = state.entries
        if entries and entries[0].expires <= now:
            self._give_back_expired(shape, state, now)
        taken = None
        if entries:
            taken = entries.popleft()
            self._count(shape, state, -1, -taken.counted_nano)
            self._taken.inc()
        if not state.refilling and state.arrivals >= HOT_ARRIVALS and len(entries) < self.batch:
            self._refill(shape, state)
        return taken

    def admitted(
        self, request: AdmissionRequest, *, left_requests: int, left_tokens: int, left_budget: int
    ) -> None:
        """A request was admitted one at a time: what its admission said was left."""
        if not self.batch:
            return
        state = self._shapes.get(shape_of(request))
        if state is not None:
            state.key.left_requests, state.key.left_tokens = left_requests, left_tokens
            state.org.left_budget = left_budget

    def _track(self, shape: Shape) -> _ShapeState | None:
        if len(self._shapes) >= MAX_SHAPES:
            # Looked over at most once a lifetime: every shape busy, nothing to forget.
            now = time.monotonic()
            if now - self._forgot_at < self.lifetime_s:
                return None
            self._forgot_at = now
            if not self._forget_idle():
                return None
        key = self._keys_waiting.setdefault(shape[1], _Waiting())
        org = self._orgs_waiting.setdefault(shape[0], _Waiting())
        key.shapes += 1
        org.shapes += 1
        state = self._shapes[shape] = _ShapeState(time.monotonic(), key, org)
        return state

    def _forget_idle(self) -> bool:
        """Room for a new shape: those with nothing waiting or on its way forgotten (with
        their keys and orgs, once no shape counts there)."""
        for shape, state in list(self._shapes.items()):
            if state.entries or state.refilling:
                continue
            if state.timer is not None:
                state.timer.cancel()
            del self._shapes[shape]
            for table, name, waiting in (
                (self._keys_waiting, shape[1], state.key),
                (self._orgs_waiting, shape[0], state.org),
            ):
                waiting.shapes -= 1
                if not waiting.shapes:
                    del table[name]
        return len(self._shapes) < MAX_SHAPES

    def _refill(self, shape: Shape, state: _ShapeState) -> None:
        """Ask for the shape's next batch, as large as the key's and the org's share of
        what they have left allows (counted as waiting from now: concurrent batches of
        the key's or the org's other shapes see it)."""
        tokens = shape[6] + shape[7]
        if not state.worst:
            try:
                state.worst = self._price(shape, datetime.now(UTC)).allowance_cost_nano
            except Exception:  # admission itself refuses (or fails) the request
                return
        key, org, share = state.key, state.org, SHARE_OF_WHAT_IS_LEFT
        count = min(
            self.batch,
            key.left_requests // share - key.count,
            (key.left_tokens // share - key.tokens) // max(1, tokens),
        )
        if state.worst > 0:
            count = min(count, (org.left_budget // share - org.nano) // state.worst)
        if count < 2:
            return
        state.refilling = True
        self._count(shape, state, count, count * state.worst)
        self._spawn(self._admit_ahead(shape, state, count, state.worst))

    @staticmethod
    def _count(shape: Shape, state: _ShapeState, count: int, nano: int) -> None:
        """``count`` more (or fewer) of the shape's admissions waiting, ``nano`` in all:
        counted for its key (requests, tokens) and its org (money)."""
        state.key.add(count, count * (shape[6] + shape[7]), 0)
        state.org.add(count, 0, nano)

    def _price(self, shape: Shape, at: datetime) -> Charge:
        return worst_case_charge(
            self._book,
            tier=shape[3],  # type: ignore[arg-type]
            model=shape[4],
            prompt_tokens=shape[6],
            max_output_tokens=shape[7],
            at=at,
        )

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _admit_ahead(
        self, shape: Shape, state: _ShapeState, count: int, asked_worst: int
    ) -> None:
        """Make ``count`` admissions of the shape, counted as waiting (at ``asked_worst``
        each) by ``_refill``: what is not made is taken off again."""
        org_id, key_id, plan_name, _, _, customer_id, prompt, output = shape
        key, org = state.key, state.org
        members = [f"{self._prefix}{next(self._ids)}" for _ in range(count)]
        period = self._period()
        made: list[Ahead] = []
        try:
            plan = self._book.plan(plan_name)
            made_at = datetime.now(UTC)
            # Until the next price or promotion change, or the month's end: an admission
            # is priced, and its money reserved in a period's budget, when it is made.
            ends = [period_bounds(period)[1], self._book.next_change_after(made_at)]
            lifetime_s = min(
                [self.lifetime_s] + [(end - made_at).total_seconds() for end in ends if end]
            )
            if lifetime_s < self.lifetime_s / 4:
                # A change (or, by this gateway's clock, the month's end: Redis's clock
                # names the period) is too close for a batch to be of use.
                return
            # Counted from before the call: a slow reply does not stretch the lifetime.
            expires = time.monotonic() + lifetime_s
            priced = self._price(shape, made_at)
            worst = state.worst = priced.allowance_cost_nano
            replies = await self._scripts.call(
                ADMIT_AHEAD_SCRIPT,
                self._keys.admission_keys(org_id, key_id, customer_id, period),
                [
                    plan.rpm,
                    plan.tpm,
                    prompt + output,
                    priced.list_cost_nano,
                    plan.period_cap_nano,
                    "",
                    self._reservation_ttl_s,
                    period,
                    priced.usage_multiplier.numerator,
                    priced.usage_multiplier.denominator,
                    plan.included_nano,
                    *members,
                ],
            )
            for member, reply in zip(members, replies, strict=False):
                if reply[0] != b"ok":  # a refusal: one at a time until an admission says
                    key.left_requests = key.left_tokens = org.left_budget = 0
                    break
                left_requests, left_tokens = int(reply[1]), int(reply[3])
                left_budget = int(reply[6])
                key.left_requests, key.left_tokens = left_requests, left_tokens
                org.left_budget = left_budget
                headers = admission_headers(reply, rpm=plan.rpm, tpm=plan.tpm)
                room = headroom(left_requests, left_tokens, left_budget, prompt + output, worst)
                made.append(Ahead(member, period, headers, int(reply[7]), worst, room, expires))
        except asyncio.CancelledError:  # the script may have run: given back, if it can be
            self._spawn(self._release(shape, period, members))
            raise
        except Exception as exc:
            # Redis away, slow or refusing. The script may have run (a reply that timed
            # out): what it admitted is given back, by every id asked for (one that was
            # not made is not there to give back), once more a moment later if Redis is
            # still too slow to take that.
            logger.warning("admitting ahead failed: %s", exc)
            key.left_requests = key.left_tokens = org.left_budget = 0
            made.clear()
            if not isinstance(exc, PriceBookError):
                self._spawn(self._release(shape, period, members, again_after_s=1.0))
        finally:
            self._count(
                shape, state, len(made) - count, len(made) * state.worst - count * asked_worst
            )
            state.refilling = False
        if self._closed:  # made while closing: given back at once
            self._spawn(self._release(shape, period, [entry.member for entry in made]))
            return
        state.entries.extend(made)
        self._arm(shape, state)

    def _arm(self, shape: Shape, state: _ShapeState) -> None:
        """One timer per shape, due when its oldest admission made ahead expires."""
        if state.timer is None and state.entries and not self._closed:
            wait_s = max(0.0, state.entries[0].expires - time.monotonic()) + 0.01
            state.timer = asyncio.get_running_loop().call_later(wait_s, self._expired, shape, state)

    def _expired(self, shape: Shape, state: _ShapeState) -> None:
        if self._closed or self._shapes.get(shape) is not state:  # forgotten since
            return
        state.timer = None
        self._give_back_expired(shape, state, time.monotonic())
        self._arm(shape, state)

    def _give_back_expired(self, shape: Shape, state: _ShapeState, now: float) -> None:
        """Give back the shape's admissions past their lifetime (batches are made in
        order and live alike, so the expired ones are the oldest)."""
        stale: list[Ahead] = []
        while state.entries and state.entries[0].expires <= now:
            stale.append(state.entries.popleft())
        if stale:
            self._count(shape, state, -len(stale), -sum(entry.counted_nano for entry in stale))
            for period in {entry.period for entry in stale}:
                members = [entry.member for entry in stale if entry.period == period]
                self._spawn(self._release(shape, period, members))

    async def _release(
        self, shape: Shape, period: str, members: list[str], again_after_s: float | None = None
    ) -> None:
        if not members:
            return
        org_id, key_id, plan_name, *_, prompt, output = shape
        budget = f"{self._keys.budget_prefix(org_id)}{period}"
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
        except Exception as exc:
            if again_after_s is not None and not self._closed:
                await asyncio.sleep(again_after_s)
                await self._release(shape, period, members)
                return
            # Held until the reservations' TTL releases them.
            logger.warning("giving back %d admissions made ahead failed: %s", len(members), exc)
        else:
            self._released.inc(int(released))

    async def aclose(self) -> None:
        """Give back every admission made ahead (and those on their way, once made)."""
        self._closed = True
        for shape, state in self._shapes.items():
            if state.timer is not None:
                state.timer.cancel()
            entries, state.entries = list(state.entries), deque()
            for period in {entry.period for entry in entries}:
                members = [entry.member for entry in entries if entry.period == period]
                self._spawn(self._release(shape, period, members))
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._shapes.clear()
        self._keys_waiting.clear()
        self._orgs_waiting.clear()
