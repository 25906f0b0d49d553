"""Trainer-side reader of the trajectory stream: drop stale, group by task for GRPO.

Trajectories arrive on a Redis Stream through a consumer group, so a trainer restart
re-reads whatever it had not acknowledged. Entries are acknowledged only after the step
that used them (or when dropped as stale or malformed), never on read.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

import redis
from pydantic import ValidationError

from training.rl.trajectory import Trajectory

_SEEN_LIMIT = 100_000


@dataclass
class ConsumerStats:
    """Running counters for the live display and metrics."""

    received: int = 0
    dropped_stale: int = 0
    dropped_malformed: int = 0
    staleness: list[int] = field(default_factory=list)


@dataclass
class TrajectoryGroup:
    """``group_size`` trajectories of one task plus the stream entries that carried them."""

    task_id: str
    trajectories: list[Trajectory]
    entry_ids: list[str]


class TrajectoryConsumer:
    """Reads ``stream`` as ``consumer`` in ``group``; yields complete, fresh task groups."""

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        group: str,
        consumer: str,
        group_size: int,
        max_staleness: int,
    ) -> None:
        if group_size < 2:
            raise ValueError("GRPO needs groups of at least two trajectories")
        self._redis = client
        self._stream = stream
        self._group = group
        self._consumer = consumer
        self._group_size = group_size
        self._max_staleness = max_staleness
        self._pending: dict[str, list[tuple[str, Trajectory]]] = defaultdict(list)
        self._seen: OrderedDict[str, None] = OrderedDict()  # recent rollout ids, bounded
        self.stats = ConsumerStats()
        try:
            client.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        # Entries delivered to this consumer before a restart and never acked come first.
        self._cursor = "0"

    def is_stale(self, trajectory: Trajectory, current_version: int) -> bool:
        """Stale when even its newest turn's policy is more than ``max_staleness`` behind.

        An episode that ran on across weight pushes (a partial rollout: each turn records
        its own version) stays while its last turns are recent; the trainer leaves out
        the turns older than the bound (``build_batch``'s ``min_version``)."""
        return current_version - trajectory.policy_version_end > self._max_staleness

    def _read(self, block_ms: int, count: int) -> list[tuple[str, dict[bytes, bytes]]]:
        entries: list[tuple[bytes | str, dict[bytes, bytes]]] = []
        if self._cursor == "0":
            reply = self._redis.xreadgroup(
                self._group, self._consumer, {self._stream: "0"}, count=count
            )
            entries = reply[0][1] if reply else []
            if not entries:
                self._cursor = ">"
        if self._cursor == ">":
            reply = self._redis.xreadgroup(
                self._group, self._consumer, {self._stream: ">"}, count=count, block=block_ms
            )
            entries = reply[0][1] if reply else []
        return [(eid.decode() if isinstance(eid, bytes) else eid, data) for eid, data in entries]

    def poll(
        self, current_version: int, block_ms: int = 1000, count: int = 64
    ) -> list[TrajectoryGroup]:
        """Read what is available and return every task group that is now complete."""
        drop: list[str] = []
        for entry_id, data in self._read(block_ms, count):
            if not data:  # a pending entry whose payload was trimmed away
                drop.append(entry_id)
                continue
            try:
                trajectory = Trajectory.model_validate_json(data[b"trajectory"])
            except (KeyError, ValidationError):
                self.stats.dropped_malformed += 1
                drop.append(entry_id)
                continue
            if trajectory.rollout_id in self._seen:
                drop.append(entry_id)
                continue
            self._seen[trajectory.rollout_id] = None
            if len(self._seen) > _SEEN_LIMIT:
                self._seen.popitem(last=False)
            self.stats.received += 1
            self._pending[trajectory.task_id].append((entry_id, trajectory))
        groups: list[TrajectoryGroup] = []
        for task_id in list(self._pending):
            fresh = []
            for entry_id, trajectory in self._pending[task_id]:
                if self.is_stale(trajectory, current_version):
                    self.stats.dropped_stale += 1
                    drop.append(entry_id)
                else:
                    fresh.append((entry_id, trajectory))
            while len(fresh) >= self._group_size:
                chosen, fresh = fresh[: self._group_size], fresh[self._group_size :]
                for _, trajectory in chosen:
                    self.stats.staleness.append(current_version - trajectory.policy_version_start)
                groups.append(
                    TrajectoryGroup(task_id, [t for _, t in chosen], [e for e, _ in chosen])
                )
            if fresh:
                self._pending[task_id] = fresh
            else:
                del self._pending[task_id]
        if drop:
            self.ack(drop)
        return groups

    def ack(self, entry_ids: list[str]) -> None:
        """Acknowledge entries once the step that used them is done, then delete them:
        the trainer's group is the stream's only reader, so it would only grow."""
        if entry_ids:
            pipe = self._redis.pipeline()
            pipe.xack(self._stream, self._group, *entry_ids)
            pipe.xdel(self._stream, *entry_ids)
            pipe.execute()
