"""Upstream pools: replicas of one tier, health-checked, least-outstanding balancing.

One pooled ``httpx.AsyncClient`` per replica keeps connections warm. ``open`` sends a
request and returns the response with its headers read (body not yet read); a connect
error, a dropped connection or a 5xx before that point is retried once on another replica,
which is safe because nothing has reached the client yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field

import httpx

from gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: Errors before any response byte: the request can go to another replica.
RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)


class NoUpstreamAvailable(Exception):
    """Every replica failed or none is configured."""


class UpstreamTimeout(Exception):
    """The upstream accepted the request but went silent past the read timeout."""


@dataclass(eq=False)
class Replica:
    url: str
    client: httpx.AsyncClient
    healthy: bool = True
    outstanding: int = 0


@dataclass(eq=False)
class UpstreamResponse:
    """An open upstream response; ``close`` frees the replica (and aborts if unread)."""

    replica: Replica
    response: httpx.Response
    _closed: bool = field(default=False)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.replica.outstanding -= 1
            await self.response.aclose()


class UpstreamPool:
    """The replicas serving one tier (a replica may also serve the other tier)."""

    def __init__(self, tier: str, replicas: list[Replica], metrics: GatewayMetrics) -> None:
        self.tier = tier
        self.replicas = replicas
        self._rotation = itertools.count()
        self._errors = {
            kind: metrics.upstream_errors.labels(tier, kind)
            for kind in ("connect", "timeout", "status_5xx", "stream_cut")
        }
        self._retries = metrics.upstream_retries.labels(tier)
        self._healthy_gauge = metrics.upstream_healthy.labels(tier)
        metrics.upstream_replicas.labels(tier).set(len(replicas))
        self.refresh_gauge()

    @property
    def healthy_count(self) -> int:
        return sum(replica.healthy for replica in self.replicas)

    def refresh_gauge(self) -> None:
        self._healthy_gauge.set(self.healthy_count)

    def count_error(self, kind: str) -> None:
        self._errors[kind].inc()

    def pick(self, exclude: set[Replica]) -> Replica | None:
        """Least outstanding requests among healthy replicas; rotate to break ties."""
        candidates = [r for r in self.replicas if r.healthy and r not in exclude]
        if not candidates:
            # Health may lag a recovery: trying a replica marked down beats refusing.
            candidates = [r for r in self.replicas if r not in exclude]
        if not candidates:
            return None
        start = next(self._rotation) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda replica: replica.outstanding)

    async def open(self, path: str, content: bytes, headers: dict[str, str]) -> UpstreamResponse:
        tried: set[Replica] = set()
        last_error = "no upstream replica configured"
        for attempt in range(2):
            replica = self.pick(tried)
            if replica is None:
                break
            if attempt:
                self._retries.inc()
            tried.add(replica)
            replica.outstanding += 1
            request = replica.client.build_request("POST", path, content=content, headers=headers)
            try:
                response = await replica.client.send(request, stream=True)
            except RETRYABLE as exc:
                replica.outstanding -= 1
                self._mark_down(replica)
                self.count_error("connect")
                last_error = f"upstream {replica.url} unreachable ({type(exc).__name__})"
                continue
            except httpx.TimeoutException:
                replica.outstanding -= 1
                self.count_error("timeout")
                raise UpstreamTimeout(f"upstream {replica.url} timed out") from None
            except BaseException:
                replica.outstanding -= 1
                raise
            if response.status_code >= 500:
                self.count_error("status_5xx")
                last_error = f"upstream {replica.url} answered {response.status_code}"
                if attempt == 0 and len(self.replicas) > 1:
                    replica.outstanding -= 1
                    await response.aclose()
                    continue
            return UpstreamResponse(replica, response)
        raise NoUpstreamAvailable(last_error)

    def _mark_down(self, replica: Replica) -> None:
        if replica.healthy:
            replica.healthy = False
            logger.warning("upstream %s marked down after a failed request", replica.url)
        self.refresh_gauge()


class Upstreams:
    """Every tier's pool, one client per distinct URL, and the background health checks."""

    def __init__(
        self,
        urls_by_tier: dict[str, list[str]],
        metrics: GatewayMetrics,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
        health_interval_s: float,
        health_timeout_s: float,
    ) -> None:
        timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=connect_timeout_s)
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self.replicas: dict[str, Replica] = {}
        for url in itertools.chain.from_iterable(urls_by_tier.values()):
            if url not in self.replicas:
                client = httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits)
                self.replicas[url] = Replica(url, client)
        self.pools = {
            tier: UpstreamPool(tier, [self.replicas[url] for url in urls], metrics)
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
                response = await replica.client.get("/health", timeout=self._health_timeout_s)
                healthy = response.status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy != replica.healthy:
                logger.warning("upstream %s healthy=%s", replica.url, healthy)
            replica.healthy = healthy

        await asyncio.gather(*(probe(replica) for replica in self.replicas.values()))
        for pool in self.pools.values():
            pool.refresh_gauge()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval_s)
            await self.check_health()

    async def start(self) -> None:
        await self.check_health()
        self._health_task = asyncio.create_task(self._health_loop())

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await asyncio.gather(*(replica.client.aclose() for replica in self.replicas.values()))
