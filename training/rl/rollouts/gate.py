"""The policy version and the barrier that makes every turn's version exact.

A turn holds a lease while its request is in flight. The weight sync raises a flag,
waits until no lease is live, swaps the weights, bumps the version and lowers the flag;
turns do not start while the flag is up. So no request straddles an update, and the
version read when the lease was taken is the one that produced the turn. Leases expire,
so a worker killed mid-turn cannot block the sync for longer than the lease TTL.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis


class SyncTimeout(RuntimeError):
    """Turns did not drain (or the flag did not drop) within the allowed time."""


def gate_prefix(trajectory_stream: str) -> str:
    """Workers and trainer of one run share a stream, so they derive the gate from it."""
    return f"{trajectory_stream}:policy"


class PolicyVersionGate:
    def __init__(self, client: redis.Redis, prefix: str, lease_ttl_s: float = 600.0) -> None:
        self._redis = client
        self._version = f"{prefix}:version"
        self._flag = f"{prefix}:syncing"
        self._leases = f"{prefix}:leases"
        self._ttl = lease_ttl_s

    def version(self) -> int:
        value = self._redis.get(self._version)
        return int(value) if value is not None else 0

    def set_version(self, version: int) -> None:
        self._redis.set(self._version, version)

    @contextmanager
    def turn(self, wait_s: float = 3600.0) -> Iterator[int]:
        """Hold a lease for one model call; yields the version serving it."""
        lease = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while True:
            if not self._redis.exists(self._flag):
                self._redis.zadd(self._leases, {lease: time.time() + self._ttl})
                if not self._redis.exists(self._flag):
                    break
                self._redis.zrem(self._leases, lease)  # lost the race with a sync: back off
            if time.monotonic() > deadline:
                raise SyncTimeout("weight sync did not finish in time")
            time.sleep(0.05)
        try:
            yield self.version()
        finally:
            self._redis.zrem(self._leases, lease)

    @contextmanager
    def exclusive(self, drain_timeout_s: float = 600.0) -> Iterator[int]:
        """Stop new turns, wait for live ones, yield the current version; then lower."""
        self._redis.set(self._flag, "1")
        try:
            deadline = time.monotonic() + drain_timeout_s
            while self._redis.zcount(self._leases, time.time(), "+inf") > 0:
                if time.monotonic() > deadline:
                    raise SyncTimeout("in-flight turns did not finish before the weight sync")
                time.sleep(0.05)
            self._redis.zremrangebyscore(self._leases, "-inf", time.time())
            yield self.version()
        finally:
            self._redis.delete(self._flag)
