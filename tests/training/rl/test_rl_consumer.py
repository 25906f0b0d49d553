"""Trajectory consumer on a real Valkey stream: grouping, staleness, acks, restarts."""

from __future__ import annotations

import uuid

import redis

from training.rl.consumer import TrajectoryConsumer
from training.trajectory import Trajectory, Turn


def _trajectory(task: str, version: int, reward: float = 1.0) -> Trajectory:
    name = uuid.uuid4().hex
    turn = Turn(
        index=0,
        policy_version=version,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        completion_logprobs=[-0.5],
    )
    return Trajectory(
        trajectory_id=name,
        rollout_id=name,
        task_id=task,
        environment="toy",
        policy_version_start=version,
        policy_version_end=version,
        turns=[turn],
        reward=reward,
        raw_reward=reward,
    )


def _publish(client: redis.Redis, stream: str, trajectory: Trajectory) -> None:
    client.xadd(stream, {"trajectory": trajectory.model_dump_json()})


def test_groups_by_task_and_drops_stale(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    stream = f"traj-{uuid.uuid4().hex}"
    consumer = TrajectoryConsumer(client, stream, "trainer", "c1", group_size=2, max_staleness=1)
    for trajectory in [
        _trajectory("a", 5),
        _trajectory("b", 5),
        _trajectory("a", 4),
        _trajectory("b", 3),
        _trajectory("a", 5),
    ]:
        _publish(client, stream, trajectory)
    client.xadd(stream, {"trajectory": b"not json"})
    groups = consumer.poll(current_version=5, block_ms=10)
    groups += consumer.poll(current_version=5, block_ms=10)
    # "a": three fresh (versions 5, 4, 5) -> one group of two, one left over;
    # "b": version 3 is two behind (stale) -> only one fresh, no group yet.
    assert [(g.task_id, len(g.trajectories)) for g in groups] == [("a", 2)]
    assert consumer.stats.dropped_stale == 1
    assert consumer.stats.dropped_malformed == 1
    assert sorted(consumer.stats.staleness) == [0, 1]
    # Stale and malformed entries are acked at once; the group's entries are not (yet).
    pending = client.xpending(stream, "trainer")["pending"]
    assert pending == 6 - 2
    consumer.ack(groups[0].entry_ids)
    assert client.xpending(stream, "trainer")["pending"] == 2
    assert client.xlen(stream) == 2  # used, stale and malformed entries are deleted


def test_unacked_entries_come_back_after_a_restart(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    stream = f"traj-{uuid.uuid4().hex}"
    first = TrajectoryConsumer(client, stream, "trainer", "c1", group_size=2, max_staleness=2)
    _publish(client, stream, _trajectory("a", 0))
    _publish(client, stream, _trajectory("a", 0))
    assert len(first.poll(current_version=0, block_ms=10)) == 1
    # The trainer dies before its step: nothing was acked, so a new process sees both.
    again = TrajectoryConsumer(client, stream, "trainer", "c1", group_size=2, max_staleness=2)
    groups = again.poll(current_version=0, block_ms=10)
    assert len(groups) == 1 and len(groups[0].trajectories) == 2
    again.ack(groups[0].entry_ids)
    third = TrajectoryConsumer(client, stream, "trainer", "c1", group_size=2, max_staleness=2)
    assert third.poll(current_version=0, block_ms=10) == []
