"""Publish finished trajectories to the Redis Stream exactly once per rollout id.

A Celery redelivery (worker killed after publishing but before the ack, or a visibility
timeout) runs the rollout again; the Lua script makes the second XADD a no-op, so the
stream holds one entry per accepted rollout.
"""

from __future__ import annotations

import redis

from training.rl.trajectory import Trajectory

# KEYS[1] done-marker, KEYS[2] stream; ARGV[1] payload, ARGV[2] marker TTL seconds.
_PUBLISH_ONCE = """
local existing = redis.call('GET', KEYS[1])
if existing then return existing end
local id = redis.call('XADD', KEYS[2], '*', 'trajectory', ARGV[1])
redis.call('SET', KEYS[1], id, 'EX', tonumber(ARGV[2]))
return id
"""


class TrajectoryPublisher:
    def __init__(self, client: redis.Redis, stream: str, marker_ttl_s: int = 7 * 86400) -> None:
        self._redis = client
        self._stream = stream
        self._ttl = marker_ttl_s
        self._script = client.register_script(_PUBLISH_ONCE)

    def _marker(self, rollout_id: str) -> str:
        return f"{self._stream}:published:{rollout_id}"

    def published_entry(self, rollout_id: str) -> str | None:
        """The stream entry id of an already published rollout, else None."""
        value = self._redis.get(self._marker(rollout_id))
        return value.decode() if isinstance(value, bytes) else value

    def publish(self, trajectory: Trajectory) -> str:
        """Append once; returns the entry id (the first one on a repeat)."""
        entry = self._script(
            keys=[self._marker(trajectory.rollout_id), self._stream],
            args=[trajectory.model_dump_json(), self._ttl],
        )
        return entry.decode() if isinstance(entry, bytes) else str(entry)
