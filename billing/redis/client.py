"""Redis clients from the product's one Redis URL: a single Redis, or a Redis Cluster.

``redis://`` and ``rediss://`` name one Redis (``unix://`` too). ``redis-cluster://`` and
``rediss-cluster://`` name a Redis Cluster by one or more of its nodes, comma-separated
(``redis-cluster://:PASSWORD@10.0.0.1:6379,10.0.0.2:6379``): the client learns the
rest of the cluster from them. The scheme says which it is, so that the one URL setting
(``CSTACK_REDIS_URL``, the chart's secret) carries it everywhere, and a cluster is never
mistaken for a single node that answers MOVED.

A cluster holds the gateway's and billing's state; Celery's broker stays on a single
Redis (Celery cannot use a cluster), set apart with ``CSTACK_CELERY_BROKER_URL``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit, urlunsplit

from redis import Redis as SyncRedis
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode as SyncClusterNode
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import RedisClusterException

CLUSTER_SCHEMES = {"redis-cluster": "redis", "rediss-cluster": "rediss"}

#: What the product's Redis clients are: one Redis, or a cluster client with the same
#: commands (each single-key command goes to its slot's primary). Typed as the single
#: Redis client: the type stubs in use declare no commands on the cluster clients.
AsyncClient = Redis
SyncClient = SyncRedis


#: What the product's Redis clients raise when Redis is not there or refuses: redis-py's
#: errors, and its cluster client's own when no node of the cluster answers.
REDIS_FAILURES: tuple[type[Exception], ...] = (
    redis_errors.RedisError,
    RedisClusterException,
    OSError,
)


class RedisUrlError(ValueError):
    """A Redis URL the product cannot use (the message names the problem)."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL: ``nodes`` are ``(host, port)`` for a cluster's seed nodes,
    ``node_url`` a plain URL of the first (credentials and TLS options included)."""

    cluster: bool
    node_url: str
    nodes: tuple[tuple[str, int], ...] = ()

    def url_for(self, host: str, port: int) -> str:
        """``node_url`` pointing at another node of the same cluster."""
        parts = urlsplit(self.node_url)
        credentials = parts.netloc.rpartition("@")[0]
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        netloc = f"{credentials}@{where}" if credentials else where
        return urlunsplit(parts._replace(netloc=netloc))


def parse_redis_url(url: str) -> RedisTarget:
    parts = urlsplit(url)
    if parts.scheme not in CLUSTER_SCHEMES:
        return RedisTarget(cluster=False, node_url=url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for hostport in hosts.split(","):
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "6379")
        host = host.strip("[]")
        if not host or not port.isdigit():
            raise RedisUrlError(f"bad node {hostport!r} in the Redis Cluster URL: use host:port")
        nodes.append((host, int(port)))
    if parts.path.strip("/") not in ("", "0"):
        raise RedisUrlError("a Redis Cluster has only database 0: drop the URL's /db")
    first = f"{nodes[0][0]}:{nodes[0][1]}"
    netloc = f"{credentials}@{first}" if credentials else first
    node_url = urlunsplit((CLUSTER_SCHEMES[parts.scheme], netloc, "", parts.query, ""))
    return RedisTarget(cluster=True, node_url=node_url, nodes=tuple(nodes))


def async_client(url: str, *, timeout_s: float | None = None) -> AsyncClient:
    """An asyncio client for ``url``; ``timeout_s`` for connecting and for each reply
    (redis-py's defaults when None)."""
    target = parse_redis_url(url)
    if not target.cluster:
        if timeout_s is None:
            return Redis.from_url(url)
        return Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    nodes = [ClusterNode(host, port) for host, port in target.nodes]
    if timeout_s is None:
        cluster: AsyncRedisCluster[bytes] = AsyncRedisCluster.from_url(
            target.node_url, startup_nodes=nodes
        )
    else:
        cluster = AsyncRedisCluster.from_url(
            target.node_url,
            startup_nodes=nodes,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
    return cast(AsyncClient, cluster)


async def connect_early(client: AsyncClient) -> None:
    """Connect now, before requests come: a cluster client learns the cluster's layout on
    first use, and redis-py's asyncio cluster client can fail a few of the commands that
    race that first use. A Redis not there yet is no error here (its callers handle it)."""
    with contextlib.suppress(*REDIS_FAILURES):
        await client.ping()


def sync_client(url: str, *, timeout_s: float | None = None) -> SyncClient:
    target = parse_redis_url(url)
    if not target.cluster:
        if timeout_s is None:
            return SyncRedis.from_url(url)
        return SyncRedis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    nodes = [SyncClusterNode(host, port) for host, port in target.nodes]
    try:
        return _sync_cluster(target, nodes, timeout_s)
    except RedisClusterException as exc:  # raised as it connects, which it does when made
        raise redis_errors.ConnectionError(f"cannot reach the Redis Cluster: {exc}") from None


def _sync_cluster(
    target: RedisTarget, nodes: list[SyncClusterNode], timeout_s: float | None
) -> SyncClient:
    if timeout_s is None:
        cluster: SyncRedisCluster[bytes] = SyncRedisCluster.from_url(
            target.node_url, startup_nodes=nodes
        )
    else:
        cluster = SyncRedisCluster.from_url(
            target.node_url,
            startup_nodes=nodes,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
        )
    return cast(SyncClient, cluster)
