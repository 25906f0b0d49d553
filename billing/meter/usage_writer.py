"""Settled usage into Redis, or onto the disk spool when Redis does not take it.

``UsageWriter.write`` is what ``billing.meter.settlement.SettlementQueue`` sends each batch
through: one settle script call (on a Redis Cluster, one per shard) applies every record
at most once, by its settled marker: its actual cost counted against the org's budget,
its reservation released, its usage event appended to the shard's stream. Records Redis
could not take (unreachable, refusing writes: loading, read-only, out of memory; on a
cluster also a shard's call that failed as a whole, a slot moving, a replica not
acknowledging) are spooled, and ``replay_spool`` sends the spool again: this process's
file and any dead process's, which the markers make idempotent.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from redis import exceptions as redis_errors
from redis._parsers.base import BaseParser

from billing import metrics
from billing.meter.keyspace import Keyspace
from billing.meter.scripts import SETTLE
from billing.meter.settlement import Record
from billing.meter.spool import UsageSpool
from billing.redis.batching import Script, ScriptBatcher
from billing.redis.client import AsyncClient
from billing.redis.cluster import ClusterScripts

logger = logging.getLogger(__name__)

SETTLE_SCRIPT = Script(SETTLE)
#: Redis did not answer: a settlement spools its record (replay is idempotent).
REDIS_DOWN = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
SETTLED_MARKER_TTL_S = 14 * 86400
#: The settled marker of releases before sharding (their spool may still hold records).
LEGACY_MARKER = "cstack:settled:"
SPOOL_RESCAN_S = 10.0
#: Outcomes that mean Redis is not taking writes now (or its shard did not answer),
#: rather than a bad record.
REFUSING_WRITES = (
    *REDIS_DOWN,
    redis_errors.OutOfMemoryError,  # type: ignore[attr-defined]  # newer than the stubs
    redis_errors.ReadOnlyError,
    redis_errors.TryAgainError,
    redis_errors.ClusterDownError,
)


class _ShardFailed(Exception):
    """A shard's settle call failed as a whole (not one record's own error): ``cause``."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _record_outcome(reply: Any) -> BaseException | None:
    """One record's reply of the settle script: None when settled (now or before), else
    the error reply as redis-py's exception for it (or the error of its shard's call)."""
    if isinstance(reply, int):
        return None
    if isinstance(reply, BaseException):
        return reply
    text = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
    return BaseParser.parse_error(text)


@functools.lru_cache(maxsize=64)
def _multiplier(written: str) -> Fraction:
    """A promotion's multiplier as a record writes it ("1", "2", "3/2"): parsed once, not
    per settlement (a Fraction costs more to build than the rest of a record's arguments)."""
    return Fraction(written)


def budget_arguments(record: Record) -> tuple[int, int, int, int]:
    """What the settle script adds to the org's budget for ``record``: its list cost, its
    promotion's multiplier (numerator, denominator) and its plan's allowance. A record
    spooled by a release before the promotion rule has only its allowance cost, which
    it added as it was: as list cost, past any allowance."""
    if "list_nano_usd" not in record:
        return int(record["allowance_nano_usd"]), 1, 1, 0
    multiplier = _multiplier(record["multiplier"])
    return (
        int(record["list_nano_usd"]),
        multiplier.numerator,
        multiplier.denominator,
        int(record["included_nano_usd"]),
    )


def _redis_refused(outcome: BaseException | None) -> bool:
    return isinstance(outcome, (*REFUSING_WRITES, _ShardFailed))


def _record_org(record: Record) -> str:
    """The org of a settlement record; a record spooled by a release before sharding has
    only its event to say."""
    org_id = record.get("org_id")
    return str(org_id) if org_id else str(json.loads(record["event"])["org_id"])


class UsageWriter:
    """``write(records)``: a batch settled in Redis or spooled; ``replay_spool()``: the
    spool sent again.

    ``scripts`` is the meter's script connection (a ``ClusterScripts`` on a cluster);
    ``redis`` a general client on the same Redis; ``answered`` is told the org of every
    record Redis took (the meter ends an outage by it).
    """

    def __init__(
        self,
        scripts: ScriptBatcher | ClusterScripts,
        keys: Keyspace,
        spool: UsageSpool,
        redis: AsyncClient,
        answered: Callable[[str], None],
    ) -> None:
        self._scripts = scripts
        self._cluster = scripts if isinstance(scripts, ClusterScripts) else None
        self._keys = keys
        self.spool = spool
        self._redis = redis
        self._answered = answered
        self._redis_answered = False
        self._replay_lock = asyncio.Lock()
        self._next_spool_scan = 0.0

    def spool_scan_due(self) -> bool:
        """Redis is taking settlements and the spool was not looked at for a while."""
        return self._redis_answered and time.monotonic() >= self._next_spool_scan

    async def write(self, records: list[Record]) -> list[BaseException | None]:
        """Settle ``records`` (one script call, or one per shard); spool those Redis could
        not take. Only a record's own failure (its keys in a bad state) is returned, as
        that record's outcome; it is logged by its caller."""
        try:
            replies = await self.send(records)
        except (*REDIS_DOWN, redis_errors.ResponseError) as exc:
            await self._spool(records, exc)
            return [None] * len(records)
        outcomes = [_record_outcome(reply) for reply in replies]
        for record, outcome in zip(records, outcomes, strict=True):
            if not _redis_refused(outcome):
                self._redis_answered = True
                self._answered(_record_org(record))
        refused = [i for i, outcome in enumerate(outcomes) if _redis_refused(outcome)]
        if refused:
            await self._spool([records[i] for i in refused], outcomes[refused[0]])
            for i in refused:
                outcomes[i] = None
        return outcomes

    async def _spool(self, records: list[Record], reason: BaseException | None) -> None:
        self._redis_answered = False
        logger.warning("Redis did not settle (%s); spooling %d usage events", reason, len(records))
        await asyncio.to_thread(self.spool.append_all, records)
        self._next_spool_scan = 0.0
        metrics.usage_spool_events.inc(len(records))

    async def send(self, records: list[Record]) -> list[Any]:
        """Settle ``records`` (each at most once, by its marker): one script call, or on a
        cluster one per shard. A shard's call that failed as a whole fails only its
        records: their outcome is that error, as ``_ShardFailed`` (spooled)."""
        keys: list[str] = []
        args: list[str | int] = []
        for record in records:
            org_id = _record_org(record)
            budget = f"{self._keys.budget_prefix(org_id)}{record['period']}"
            keys += [
                self._keys.settled_marker(org_id, record["event_id"]),
                self._keys.usage_stream_of(org_id),
                budget,
                f"{budget}:resv",
                f"{budget}:resv-amount",
            ]
            # The reservation's id: the request's, unless it was admitted on a lease (then
            # its part of the lease's reservation).
            reservation: str = record.get("reservation") or record["event_id"]
            part = int(record.get("part", -1))  # -1: the whole reservation
            args += [reservation, part, *budget_arguments(record), record["event"]]
        if self._cluster is None:
            return list(
                await self._scripts.call(SETTLE_SCRIPT, keys, [SETTLED_MARKER_TTL_S, *args])
            )
        groups = list(self._cluster.group(keys[0::5]).values())  # records by their slot
        sent = await asyncio.gather(
            *(
                self._cluster.call(
                    SETTLE_SCRIPT,
                    [k for i in group for k in keys[5 * i : 5 * i + 5]],
                    [SETTLED_MARKER_TTL_S, *(a for i in group for a in args[7 * i : 7 * i + 7])],
                    durable=True,  # on a replica too, or spooled: a failover loses no money
                )
                for group in groups
            ),
            return_exceptions=True,
        )
        replies: list[Any] = [None] * len(records)
        for group, reply in zip(groups, sent, strict=True):
            if isinstance(reply, BaseException) and not isinstance(reply, Exception):
                raise reply
            for position, i in enumerate(group):
                # A shard's call that failed as a whole is spooled, as on a single Redis.
                replies[i] = (
                    _ShardFailed(reply) if isinstance(reply, Exception) else reply[position]
                )
        return replies

    async def _send_one(self, record: Record) -> None:
        """A spooled record, sent again (an error leaves it spooled)."""
        # A cluster never ran the release before sharding, so holds none of its markers.
        legacy = "org_id" not in record and self._cluster is None
        if legacy and await self._redis.exists(LEGACY_MARKER + record["event_id"]):
            return  # spooled by a release before sharding, which had settled it after all
        outcome = _record_outcome((await self.send([record]))[0])
        if isinstance(outcome, _ShardFailed):
            raise outcome.cause
        if outcome is not None:
            raise outcome
        self._answered(_record_org(record))

    async def replay_spool(self) -> int:
        """Send every spooled event (this process's and any dead process's) to Redis."""
        if self._replay_lock.locked():
            return 0
        async with self._replay_lock:
            self._next_spool_scan = time.monotonic() + SPOOL_RESCAN_S
            try:
                sent = await self.spool.replay(self._send_one)
            except (*REDIS_DOWN, redis_errors.ResponseError) as exc:
                logger.warning("spool replay stopped, Redis did not take it: %s", exc)
                sent = 0
            remaining = await asyncio.to_thread(self.spool.pending_count)
            metrics.usage_spool_events.set(remaining)
            if sent:
                logger.info("replayed %d spooled usage events", sent)
            return sent
