"""The meter's scripts on a Redis Cluster: each call to the primary of its keys' slot.

A script call's keys are all in one slot (``billing.meter.keyspace`` tags them by shard), so a
call goes whole to one primary, on that primary's pipelined connection
(``billing.redis.resp``), batched with the other calls of the moment to the same node. The slot
map comes from ``CLUSTER SLOTS``, asked of any node that answers.

What the cluster says is followed: MOVED (the slot has a new owner: a failover, a
resharding) sends the call again to the node named, which is safe as the script did not
run, and has the map asked for again in the background; ASK (a slot half-way through
migration) sends it once to the node named, after ASKING. A call touching a key not yet
present in a slot being migrated gets TRYAGAIN, and the meter's calls always do (a
suspension flag that is not set, a new settled marker): for the whole migration of a slot,
the meter treats its shard as in an outage. A node that cannot be reached fails the call
with redis-py's ConnectionError, which the meter treats as for a single Redis (settlements
spool, admission takes the outage allowance), and marks the map stale: it is asked for
again in the background, at most every ``REFRESH_INTERVAL_S``, from the nodes that last
answered first, so that a failover is followed once a replica has taken over, and calls
for the other primaries never wait for it.

A primary acknowledges a write before its replicas have it, so a failover can lose the
last writes. For settlements that would be lost money: a ``durable`` call is followed by
a WAIT for one replica (where the slot has any), on a connection of its own so that the
wait never holds up admissions, and a call no replica acknowledged fails with a
TimeoutError; the meter then spools it, and its replay, idempotent by the settled
marker, applies it on whichever node holds the slot by then. A primary whose replica
lags holds its durable calls up to 500 ms each, one after another on that connection:
past ``MAX_DURABLE_IN_FLIGHT`` calls waiting there, more are spooled at once, so that
settlements never pile up in memory.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as redis_errors
from redis.crc import key_slot

from billing.redis.batching import ReplicaLagging, Script, ScriptBatcher
from billing.redis.client import RedisTarget
from billing.redis.resp import Arg, RespConnection, command

logger = logging.getLogger(__name__)

#: Redirections followed for one call before giving up (a map that keeps moving).
MAX_REDIRECTS = 3
#: The least time between two slot-map refreshes, so an outage does not turn every
#: call into a CLUSTER SLOTS of its own.
REFRESH_INTERVAL_S = 0.1
#: How long a durable call waits for a replica's acknowledgement (normally under 1 ms).
REPLICA_TIMEOUT_MS = 500
#: Durable calls that may wait on one primary's connection at once (each holds a batch).
MAX_DURABLE_IN_FLIGHT = 64

Node = tuple[str, int]


class ClusterScripts:
    """``await call(script, keys, args)`` on the primary of ``keys``' slot (they must share
    one, as Redis Cluster requires of a script)."""

    def __init__(self, target: RedisTarget, scripts: Sequence[Script], *, timeout_s: float) -> None:
        # Made now to check the URL's options: a node's connection is made on first use.
        RespConnection(target.node_url, timeout_s=timeout_s)
        self._target = target
        self._scripts = list(scripts)
        self._timeout_s = timeout_s
        #: Sorted first slots of the map's ranges, and each range's (last slot, primary,
        #: whether it has replicas).
        self._starts: list[int] = []
        self._ranges: list[tuple[int, Node, bool]] = []
        #: Per primary: the connection for calls, and the one for durable calls.
        self._batchers: dict[tuple[Node, bool], ScriptBatcher] = {}
        self._stale = True
        self._refreshed_at = -float("inf")
        self._refreshing: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        #: Nodes whose last call or map request failed: asked for the map last.
        self._failed: set[Node] = set()
        self._durable_in_flight: dict[Node, int] = {}
        self._closed = False

    async def call(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], *, durable: bool = False
    ) -> Any:
        """``durable``: on a replica too before it returns (where the slot has one)."""
        slot = key_slot(keys[0].encode())
        node, has_replicas = await self._primary(slot)
        for _ in range(MAX_REDIRECTS):
            replicas = 1 if durable and has_replicas else 0
            try:
                return await self._send(node, replicas, script, keys, args, asking=False)
            except redis_errors.MovedError as moved:
                # The slot's owner now, as the cluster says: sent there at once, while
                # the map is asked for again in the background. (No host: the node that
                # answered's, as for a cluster that announces no endpoints.)
                node = (moved.host or node[0], int(moved.port))
                self._stale = True
                self._refreshed_at = -float("inf")
                self._refresh_soon()
            except redis_errors.AskError as ask:
                target = (ask.host or node[0], int(ask.port))
                try:
                    return await self._send(target, replicas, script, keys, args, asking=True)
                except redis_errors.AskError as again:  # moved on meanwhile: try later
                    raise redis_errors.TryAgainError(str(again)) from None
            except ReplicaLagging:
                raise  # the primary answered: nothing about the map to learn
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
                self._stale = True
                self._failed.add(node)
                raise
        raise redis_errors.TryAgainError(f"slot {slot} kept moving")

    async def _send(
        self,
        node: Node,
        replicas: int,
        script: Script,
        keys: Sequence[str],
        args: Sequence[Arg],
        *,
        asking: bool,
    ) -> Any:
        batcher = self._batcher(node, replicas > 0)
        if not replicas:
            reply = await batcher.call(script, keys, args, asking=asking)
            self._failed.discard(node)
            return reply
        if self._durable_in_flight.get(node, 0) >= MAX_DURABLE_IN_FLIGHT:
            raise ReplicaLagging(
                "Timeout waiting for replica acknowledgements: too many calls waiting"
            )
        self._durable_in_flight[node] = self._durable_in_flight.get(node, 0) + 1
        try:
            reply = await batcher.call(
                script,
                keys,
                args,
                asking=asking,
                replicas=replicas,
                replica_timeout_ms=REPLICA_TIMEOUT_MS,
            )
        finally:
            self._durable_in_flight[node] -= 1
        self._failed.discard(node)
        return reply

    def group(self, keys: Sequence[str]) -> dict[int, list[int]]:
        """Indexes of ``keys`` by slot: the calls a multi-shard batch splits into."""
        groups: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            groups.setdefault(key_slot(key.encode()), []).append(index)
        return groups

    async def _primary(self, slot: int) -> tuple[Node, bool]:
        if not self._ranges:
            await self._refresh()
        elif self._stale:
            # The map in hand serves meanwhile: a call to a node that moved gets MOVED.
            self._refresh_soon()
        at = bisect.bisect_right(self._starts, slot) - 1
        if at >= 0 and slot <= self._ranges[at][0]:
            _, node, has_replicas = self._ranges[at]
            return node, has_replicas
        raise redis_errors.ClusterDownError(f"slot {slot} is not served by any node")

    def _batcher(self, node: Node, durable: bool) -> ScriptBatcher:
        batcher = self._batchers.get((node, durable))
        if batcher is None:
            if self._closed:
                raise redis_errors.ConnectionError("the meter's Redis connection is closed")
            connection = RespConnection(self._target.url_for(*node), timeout_s=self._timeout_s)
            batcher = self._batchers[node, durable] = ScriptBatcher(connection, self._scripts)
        return batcher

    async def _refresh(self) -> None:
        """Wait for a map (there is none yet): one request at a time, shared."""
        refreshing = self._refreshing
        if refreshing is None or refreshing.done():
            refreshing = self._refreshing = asyncio.get_running_loop().create_task(
                self._load_slots()
            )
        await asyncio.shield(refreshing)

    def _refresh_soon(self) -> None:
        wait = self._refreshed_at + REFRESH_INTERVAL_S - time.monotonic()
        if wait > 0 or (self._refreshing is not None and not self._refreshing.done()):
            return
        self._refreshing = asyncio.get_running_loop().create_task(self._load_slots())
        self._refreshing.add_done_callback(_log_refresh_failure)

    async def _load_slots(self) -> None:
        self._refreshed_at = time.monotonic()
        known = [node for node, _ in self._batchers]
        candidates = list(dict.fromkeys([*known, *self._target.nodes]))
        candidates.sort(key=lambda node: node in self._failed)  # those that answered first
        last_error: Exception = redis_errors.ConnectionError("no Redis Cluster node given")
        for node in candidates:
            connection = RespConnection(self._target.url_for(*node), timeout_s=self._timeout_s)
            try:
                reply = await connection.request(command(b"CLUSTER", b"SLOTS"))
            except (redis_errors.RedisError, OSError) as exc:
                last_error = exc
                self._failed.add(node)
                continue
            finally:
                await connection.aclose()
            if isinstance(reply, redis_errors.RedisError):
                last_error = reply
                continue
            self._apply(reply, asked=node)
            return
        raise last_error

    def _apply(self, reply: list[Any], *, asked: Node) -> None:
        ranges = []
        for entry in reply:
            start, end, primary = int(entry[0]), int(entry[1]), entry[2]
            host = primary[0].decode() if primary[0] else asked[0]  # "" means the one asked
            ranges.append((start, end, (host, int(primary[1])), len(entry) > 3))
        ranges.sort()
        self._starts = [start for start, _, _, _ in ranges]
        self._ranges = [(end, node, replicas) for _, end, node, replicas in ranges]
        self._stale = False
        primaries = {node for _, node, _ in self._ranges}
        for key in [key for key in self._batchers if key[0] not in primaries]:
            # A primary no more (failed over, removed): its connections go.
            closing = asyncio.get_running_loop().create_task(self._batchers.pop(key).aclose())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        logger.debug(
            "Redis Cluster slot map: %d ranges on %d primaries", len(ranges), len(primaries)
        )

    async def aclose(self) -> None:
        self._closed = True
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        batchers, self._batchers = list(self._batchers.values()), {}
        await asyncio.gather(*(batcher.aclose() for batcher in batchers), *self._closing)


def _log_refresh_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("Redis Cluster slot map not refreshed: %s", task.exception())
