"""Upstream pools: replicas of one tier, health-checked, prefix-aware balancing.

One pool of keep-alive connections per replica (``gateway.upstream.http1`` says why not httpx).
``open`` sends a request and returns the response with its head read (body not yet read);
a connect error, a dropped connection or a 5xx before that point is retried once on
another replica, which is safe because nothing has reached the client yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from gateway.metrics import GatewayMetrics
from gateway.upstream.engine_slots import EngineSlots
from gateway.upstream.http1 import (
    ConnectionPool,
    Response,
    UpstreamConnectError,
    UpstreamReadTimeout,
)
from gateway.upstream.routing import PrefixKey, PrefixTable, RoutingPolicy
from gateway.upstream.slot_policy import SlotPolicy
from serving.vocabulary import Tier

logger = logging.getLogger(__name__)


class NoUpstreamAvailable(Exception):
    """Every replica failed or none is configured."""


class UpstreamTimeout(Exception):
    """The upstream accepted the request but went silent past the read timeout."""


@dataclass(eq=False)
class Replica:
    url: str
    pool: ConnectionPool | None = None
    healthy: bool = True
    outstanding: int = 0
    #: Its engine's request slots, shared by the tiers it serves; None: no limit.
    slots: EngineSlots | None = None
    #: The context length its engine reports (``GET /v1/models``); None until it has.
    max_model_len: int | None = None

    @property
    def client(self) -> ConnectionPool:
        assert self.pool is not None, "Upstreams.start() opens the pools"
        return self.pool


@dataclass(eq=False)
class UpstreamResponse:
    """An open upstream response; ``close`` frees the replica (and aborts if unfinished)."""

    replica: Replica
    response: Response
    tier: str
    #: The engine slots it holds (0 on a replica without a slot limit).
    slots: int
    #: The org it is for (engine slots are shared fairly between orgs).
    org: str = ""
    _closed: bool = field(default=False)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            release(self.replica, self.tier, self.slots, self.org)
            self.response.close()


def release(replica: Replica, tier: str, slots: int, org: str = "") -> None:
    """The request has left ``replica``: its slots (and its count) free up."""
    replica.outstanding -= 1
    if replica.slots is not None and slots:
        replica.slots.give_back(tier, slots, org)


class UpstreamPool:
    """The replicas serving one tier (a replica may also serve the other tier)."""

    def __init__(
        self,
        tier: Tier,
        replicas: list[Replica],
        metrics: GatewayMetrics,
        max_queue_wait_s: float = 30.0,
        routing: RoutingPolicy = "prefix",
    ) -> None:
        self.tier = tier
        self.replicas = replicas
        self.routing: RoutingPolicy = routing
        #: Where each prompt prefix was last sent (``routing == "prefix"``).
        self.prefixes: PrefixTable[Replica] | None = (
            PrefixTable() if routing == "prefix" and len(replicas) > 1 else None
        )
        #: How long a request may wait in the gateway for a slot on a full engine.
        self.max_queue_wait_s = max_queue_wait_s
        self._rotation = itertools.count()
        self._errors = {
            kind: metrics.upstream_errors.labels(tier, kind)
            for kind in ("connect", "timeout", "status_5xx", "stream_cut")
        }
        self._retries = metrics.upstream_retries.labels(tier)
        self._healthy_gauge = metrics.upstream_healthy.labels(tier)
        metrics.upstream_replicas.labels(tier).set(len(replicas))
        #: The longest context of the pool's engines, once every replica has reported its
        #: own: admission caps each sequence's output by it (vLLM clamps to it). None
        #: while any replica is unknown, so the cap is never below a real engine's.
        self.max_model_len: int | None = None
        self.refresh_gauge()

    @property
    def healthy_count(self) -> int:
        return sum(replica.healthy for replica in self.replicas)

    def refresh_gauge(self) -> None:
        self._healthy_gauge.set(self.healthy_count)
        lengths = [replica.max_model_len for replica in self.replicas]
        known = [length for length in lengths if length is not None]
        self.max_model_len = max(known) if known and len(known) == len(lengths) else None

    def count_error(self, kind: str) -> None:
        self._errors[kind].inc()

    def pick(
        self, exclude: set[Replica], turn: int, key: PrefixKey | None = None, org: str | None = None
    ) -> Replica | None:
        """The replica for a request (``key``: its prompt prefix, for prefix routing).

        Among healthy replicas: by the pool's routing policy, a full engine last. ``turn``
        rotates ties, one turn per request, not per pick: were a retry's pick to advance
        the rotation, two replicas with one failing would see every request try the
        failing one first.
        """
        candidates = [r for r in self.replicas if r.healthy and r not in exclude]
        if not candidates:
            # Health may lag a recovery: trying a replica marked down beats refusing.
            candidates = [r for r in self.replicas if r not in exclude]
        if not candidates:
            return None
        if len(candidates) == 1:  # every policy picks it: no need to weigh it
            return candidates[0]
        start = turn % len(candidates)
        rotated = candidates[start:] + candidates[:start]

        # ``org``'s view: a replica whose free slots are headroom kept for other orgs is
        # full to it (``EngineSlots``).
        def full(replica: Replica) -> bool:
            return self._full(replica, 1, org)

        def load(replica: Replica) -> int:
            # A full engine counts as busier than any slack: the request would only queue.
            return replica.outstanding + (1 << 20 if full(replica) else 0)

        def least_loaded(candidates: Sequence[Replica]) -> Replica:
            return min(candidates, key=lambda replica: (full(replica), replica.outstanding))

        if self.routing == "round_robin":
            return min(rotated, key=full)  # the first in turn that has room
        if self.prefixes is not None and key is not None and len(rotated) > 1:
            return self.prefixes.pick(key, rotated, load, least_loaded)
        return least_loaded(rotated)

    def has_room(self, sequences: int = 1, org: str | None = None) -> bool:
        """Whether a request of ``sequences`` (of ``org``, where known) would get slots at
        once on a healthy replica (always, on a replica without a slot limit)."""
        return any(r.healthy and not self._full(r, sequences, org) for r in self.replicas)

    def _full(self, replica: Replica, sequences: int = 1, org: str | None = None) -> bool:
        slots = replica.slots
        return slots is not None and (
            slots.waiting(self.tier) > 0 or not slots.has_room(self.tier, sequences, org)
        )

    async def open(
        self,
        path: str,
        content: bytes,
        headers: dict[str, str],
        avoid: Replica | None = None,
        sequences: int = 1,
        key: PrefixKey | None = None,
        meanwhile: Callable[[], Awaitable[object]] | None = None,
        org: str = "",
    ) -> UpstreamResponse:
        """Send to the best replica (never ``avoid``: it just failed this request), once
        its engine has slots for the request's ``sequences`` (``EngineBusy`` if it has not
        within the pool's queue wait). ``meanwhile`` is awaited once the request is
        written, before its answer (``ConnectionPool.request``); it may be awaited again
        if the request is sent again elsewhere, so it must be idempotent."""
        tried: set[Replica] = set() if avoid is None else {avoid}
        last_error = "no upstream replica configured"
        turn = next(self._rotation)
        for attempt in range(2):
            replica = self.pick(tried, turn, key, org)
            if replica is None:
                break
            if attempt or avoid is not None:
                self._retries.inc()
            tried.add(replica)
            taken = 0
            if replica.slots is not None:
                taken = await replica.slots.take(self.tier, self.max_queue_wait_s, sequences, org)
            replica.outstanding += 1
            try:
                response = await replica.client.request(path, content, headers, meanwhile)
            except UpstreamReadTimeout:
                release(replica, self.tier, taken, org)
                self.count_error("timeout")
                raise UpstreamTimeout(f"upstream {replica.url} timed out") from None
            except UpstreamConnectError as exc:
                # Refused, reset or dropped before any response byte: try another replica.
                release(replica, self.tier, taken, org)
                self._mark_down(replica)
                self.count_error("connect")
                last_error = f"upstream {replica.url} unreachable ({exc})"
                continue
            except BaseException:
                release(replica, self.tier, taken, org)
                raise
            if response.status >= 500:
                self.count_error("status_5xx")
                last_error = f"upstream {replica.url} answered {response.status}"
                if attempt == 0 and len(self.replicas) > 1:
                    release(replica, self.tier, taken, org)
                    response.close()
                    continue
            if self.prefixes is not None and key is not None and response.status < 500:
                self.prefixes.record(key, replica)  # it has the prompt now (not one that failed)
            return UpstreamResponse(replica, response, self.tier, taken, org)
        raise NoUpstreamAvailable(last_error)

    def _mark_down(self, replica: Replica) -> None:
        if replica.healthy:
            replica.healthy = False
            logger.warning("upstream %s marked down after a failed request", replica.url)
            self.forget(replica)
        self.refresh_gauge()

    def forget(self, replica: Replica) -> None:
        """``replica`` went down: whatever it had cached is gone with it."""
        if self.prefixes is not None:
            self.prefixes.forget(replica)


class Upstreams:
    """Every tier's pool, one connection pool per distinct URL, background health checks."""

    def __init__(
        self,
        urls_by_tier: dict[Tier, list[str]],
        metrics: GatewayMetrics,
        *,
        slot_policies: dict[str, SlotPolicy] | None = None,
        max_queue_wait_s: dict[Tier, float] | None = None,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
        health_interval_s: float,
        health_timeout_s: float,
        api_key: str | None = None,
        routing: RoutingPolicy = "prefix",
    ) -> None:
        """``api_key``: the upstreams' (vLLM's) key, sent on every request to them.
        ``slot_policies``: per URL, how its engine's slots are shared (none: no limit);
        ``max_queue_wait_s``: per tier, the longest wait for a slot; ``routing``: how a
        pool of several replicas picks one (``gateway.upstream.routing``)."""
        self._connect_timeout_s = connect_timeout_s
        self._api_key = api_key
        self._read_timeout_s = read_timeout_s
        self._max_connections = max_connections
        self.replicas: dict[str, Replica] = {}
        policies = slot_policies or {}
        for url in itertools.chain.from_iterable(urls_by_tier.values()):
            policy = policies.get(url)
            slots = None if policy is None else EngineSlots(policy)
            self.replicas.setdefault(url, Replica(url, slots=slots))
        waits = max_queue_wait_s or {}
        self.pools: dict[str, UpstreamPool] = {
            tier: UpstreamPool(
                tier,
                [self.replicas[url] for url in urls],
                metrics,
                waits.get(tier, 30.0),
                routing,
            )
            for tier, urls in urls_by_tier.items()
        }
        self._health_interval_s = health_interval_s
        self._health_timeout_s = health_timeout_s
        self._health_task: asyncio.Task[None] | None = None

    def ready(self) -> bool:
        return all(pool.healthy_count > 0 for pool in self.pools.values())

    async def check_health(self) -> None:
        async def probe(replica: Replica) -> None:
            try:
                status = await asyncio.wait_for(
                    replica.client.get_status("/health"), self._health_timeout_s
                )
                healthy = status == 200
            except (TimeoutError, UpstreamConnectError, UpstreamReadTimeout, OSError):
                healthy = False
            if healthy != replica.healthy:
                logger.warning("upstream %s healthy=%s", replica.url, healthy)
                if not healthy:
                    for pool in self.pools.values():
                        pool.forget(replica)
            replica.healthy = healthy
            # A replica that comes back may have been redeployed with another context.
            if not healthy:
                replica.max_model_len = None
            elif replica.max_model_len is None:
                replica.max_model_len = await self._context_length(replica)

        await asyncio.gather(*(probe(replica) for replica in self.replicas.values()))
        for pool in self.pools.values():
            pool.refresh_gauge()

    async def _context_length(self, replica: Replica) -> int | None:
        """The longest ``max_model_len`` the replica's ``/v1/models`` lists (vLLM's field)."""
        try:
            status, body = await asyncio.wait_for(
                replica.client.get("/v1/models"), self._health_timeout_s
            )
            models = json.loads(body).get("data") if status == 200 else None
        except (TimeoutError, UpstreamConnectError, UpstreamReadTimeout, OSError, ValueError):
            return None
        if not isinstance(models, list):
            return None
        lengths = [m.get("max_model_len") for m in models if isinstance(m, dict)]
        valid = [length for length in lengths if isinstance(length, int) and length > 0]
        return max(valid) if valid else None

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval_s)
            await self.check_health()

    async def start(self) -> None:
        """Open the connection pools (they bind to the running loop), check health once."""
        for replica in self.replicas.values():
            replica.pool = ConnectionPool(
                replica.url,
                limit=self._max_connections,
                connect_timeout_s=self._connect_timeout_s,
                read_timeout_s=self._read_timeout_s,
                api_key=self._api_key,
            )
        await self.check_health()
        self._health_task = asyncio.create_task(self._health_loop())

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        for replica in self.replicas.values():
            if replica.pool is not None:
                replica.pool.close()
