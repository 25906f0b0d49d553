"""Moves usage events from the Redis streams into the ledger, exactly once per event id.

There is a usage stream per shard of billing's keys (``billing.meter.keyspace``); a drain reads
them in turn, a batch from each, until all are empty.

Entries are read through a consumer group and acknowledged only after the ledger commit,
so a worker killed mid-batch leaves its entries pending; another run reclaims them with
XAUTOCLAIM and the ledger's unique event id turns the redelivery into a no-op. Entries
that can never be written (unparseable, rejected by the database, or delivered too many
times) go to a dead-letter stream with the reason, instead of blocking the stream.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis import Redis
from redis import exceptions as redis_errors
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from billing import metrics
from billing.ledger.writes import insert_usage_events
from billing.meter.events import UsageEvent
from billing.meter.keyspace import Keyspace
from billing.settings import BillingSettings

logger = logging.getLogger(__name__)

Entry = tuple[bytes, dict[bytes, bytes]]


@dataclass
class DrainResult:
    read: int = 0
    inserted: int = 0
    dead_lettered: int = 0


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class UsageStreamConsumer:
    def __init__(self, redis: Redis, engine: Engine, settings: BillingSettings) -> None:
        self.redis = redis
        self.engine = engine
        self.settings = settings
        self.streams = Keyspace(settings.billing_shards, settings.usage_stream).usage_streams()
        self.group = settings.usage_consumer_group
        self.name = consumer_name()

    def ensure_group(self) -> None:
        for stream in self.streams:
            try:
                self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis_errors.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def drain(self, max_seconds: float) -> DrainResult:
        """Write stream entries to the ledger until the streams are empty or time is up."""
        self.ensure_group()
        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))  # no reclaiming while the ledger is down
        result = DrainResult()
        deadline = time.monotonic() + max_seconds
        for stream in self.streams:
            self._process(stream, self._reclaim(stream), result, reclaimed=True)
        # A batch from each stream in turn, so that a busy shard does not starve the rest.
        busy = list(self.streams)
        while busy and time.monotonic() < deadline:
            for stream in list(busy):
                reply = self.redis.xreadgroup(
                    self.group, self.name, {stream: ">"}, count=self.settings.ledger_batch_size
                )
                entries: list[Entry] = reply[0][1] if reply else []
                if entries:
                    self._process(stream, entries, result, reclaimed=False)
                else:
                    busy.remove(stream)
        metrics.usage_stream_lag.set(sum(self.redis.xlen(stream) for stream in self.streams))
        metrics.usage_dead_letters.set(self.redis.xlen(self.settings.usage_dead_letter_stream))
        return result

    def _reclaim(self, stream: str) -> list[Entry]:
        """Entries another consumer read but never acknowledged (it died mid-batch)."""
        reply = self.redis.xautoclaim(
            stream,
            self.group,
            self.name,
            min_idle_time=self.settings.ledger_claim_idle_ms,
            start_id="0-0",
            count=self.settings.ledger_batch_size,
        )
        return [entry for entry in reply[1] if entry and entry[1]]

    def _deliveries(self, stream: str, entry_id: bytes) -> int:
        pending = self.redis.xpending_range(stream, self.group, min=entry_id, max=entry_id, count=1)
        return int(pending[0]["times_delivered"]) if pending else 0

    def _process(
        self, stream: str, entries: list[Entry], result: DrainResult, *, reclaimed: bool
    ) -> None:
        result.read += len(entries)
        events: list[tuple[Entry, UsageEvent]] = []
        dead: list[tuple[Entry, str]] = []
        for entry in entries:
            entry_id, fields = entry
            if (
                reclaimed
                and self._deliveries(stream, entry_id) > self.settings.ledger_max_deliveries
            ):
                dead.append((entry, "delivered too many times"))
                continue
            try:
                events.append((entry, UsageEvent.model_validate_json(fields[b"event"])))
            except (KeyError, ValidationError, ValueError) as exc:
                dead.append((entry, f"not a usage event: {exc}"))
        try:
            result.inserted += self._write([event for _, event in events])
        except OperationalError:
            raise  # the ledger is down: leave everything pending for a later run
        except DBAPIError:
            # One bad row fails the whole batch: find it by writing one at a time.
            for candidate, event in events:
                try:
                    result.inserted += self._write([event])
                except OperationalError:
                    raise
                except DBAPIError as exc:
                    dead.append((candidate, str(exc)))
        self._dead_letter(dead)
        result.dead_lettered += len(dead)
        self._acknowledge(stream, [entry_id for entry_id, _ in entries])

    def _write(self, events: list[UsageEvent]) -> int:
        with self.engine.begin() as connection:
            inserted = insert_usage_events(connection, events)
        metrics.ledger_rows.inc(inserted)
        return inserted

    def _dead_letter(self, dead: list[tuple[Entry, str]]) -> None:
        for (entry_id, fields), reason in dead:
            logger.error("dead-lettering usage stream entry %s: %s", entry_id.decode(), reason)
            payload: dict[Any, Any] = dict(fields)
            payload[b"source_id"] = entry_id
            payload[b"reason"] = reason[:2000].encode()
            self.redis.xadd(self.settings.usage_dead_letter_stream, payload)

    def _acknowledge(self, stream: str, entry_ids: list[bytes]) -> None:
        """XACK after the commit; XDEL too, so the stream's length is the ledger's lag."""
        if not entry_ids:
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.xack(stream, self.group, *entry_ids)
        pipe.xdel(stream, *entry_ids)
        pipe.execute()
