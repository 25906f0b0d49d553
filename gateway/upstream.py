"""Upstream pools: replicas of one tier, health-checked, least-outstanding balancing.

One pooled client session per replica keeps connections warm. ``open`` sends a request
and returns the response with its headers read (body not yet read); a connect error, a
dropped connection or a 5xx before that point is retried once on another replica, which
is safe because nothing has reached the client yet.

The client is aiohttp rather than httpx: on these 2-core machines httpx spent 1.2-2.4 ms
of CPU per proxied request (its connection pool scans every connection through anyio on
each request) against 0.15-0.2 ms for aiohttp, and the gateway's budget is 1 ms added at
p50 (see bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)


def is_read_timeout(exc: BaseException) -> bool:
    """Silence past the read timeout: the request may be running upstream, never retried."""
    return isinstance(exc, asyncio.TimeoutError) and not isinstance(
        exc, aiohttp.ConnectionTimeoutError
    )


class NoUpstreamAvailable(Exception):
    """Every replica failed or none is configured."""


class UpstreamTimeout(Exception):
    """The upstream accepted the request but went silent past the read timeout."""


@dataclass(eq=False)
class Replica:
    url: str
    session: aiohttp.ClientSession | None = None
    healthy: bool = True
    outstanding: int = 0
    #: Parsed URLs per path: parsing a URL string costs more than the rest of a send.
    _urls: dict[str, URL] = field(default_factory=dict)

    def url_for(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.url + path)
        return url

    @property
    def client(self) -> aiohttp.ClientSession:
        assert self.session is not None, "Upstreams.start() opens the sessions"
        return self.session


@dataclass(eq=False)
class UpstreamResponse:
    """An open upstream response; ``close`` frees the replica (and aborts if unread)."""

    replica: Replica
    response: aiohttp.ClientResponse
    _closed: bool = field(default=False)

    def close(self) -> None:
        """Release a fully read response's connection; an unread one is closed, which is
        what makes vLLM abort the request."""
        if not self._closed:
            self._closed = True
            self.replica.outstanding -= 1
            if self.response.content.at_eof():
                self.response.release()
            else:
                self.response.close()


class UpstreamPool:
    """The replicas serving one tier (a replica may also serve the other tier)."""

    def __init__(
        self,
        tier: str,
        replicas: list[Replica],
        metrics: GatewayMetrics,
        timeout: aiohttp.ClientTimeout,
    ) -> None:
        self.tier = tier
        self._timeout = timeout
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
            try:
                response = await replica.client.post(
                    replica.url_for(path), data=content, headers=headers, timeout=self._timeout
                )
            except BaseException as exc:
                replica.outstanding -= 1
                if is_read_timeout(exc):
                    self.count_error("timeout")
                    raise UpstreamTimeout(f"upstream {replica.url} timed out") from None
                if not isinstance(exc, aiohttp.ClientConnectionError):
                    raise
                # Refused, reset or dropped before any response byte: try another replica.
                self._mark_down(replica)
                self.count_error("connect")
                last_error = f"upstream {replica.url} unreachable ({type(exc).__name__})"
                continue
            if response.status >= 500:
                self.count_error("status_5xx")
                last_error = f"upstream {replica.url} answered {response.status}"
                if attempt == 0 and len(self.replicas) > 1:
                    replica.outstanding -= 1
                    response.close()
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
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._max_connections = max_connections
        self.replicas: dict[str, Replica] = {}
        for url in itertools.chain.from_iterable(urls_by_tier.values()):
            self.replicas.setdefault(url, Replica(url))
        self.pools = {
            tier: UpstreamPool(tier, [self.replicas[url] for url in urls], metrics, timeout)
            for tier, urls in urls_by_tier.items()
        }
        self._health_interval_s = health_interval_s
        self._health_timeout_s = health_timeout_s
        self._health_task: asyncio.Task[None] | None = None

    def ready(self) -> bool:
        return all(pool.healthy_count > 0 for pool in self.pools.values())

    async def check_health(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self._health_timeout_s)

        async def probe(replica: Replica) -> None:
            try:
                async with replica.client.get(
                    replica.url_for("/health"), timeout=timeout
                ) as answer:
                    healthy = answer.status == 200
            except (TimeoutError, aiohttp.ClientError):
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
        """Open the sessions (they bind to the running loop) and check health once."""
        for replica in self.replicas.values():
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0)
            replica.session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )
        await self.check_health()
        self._health_task = asyncio.create_task(self._health_loop())

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await asyncio.gather(
            *(r.session.close() for r in self.replicas.values() if r.session is not None)
        )
