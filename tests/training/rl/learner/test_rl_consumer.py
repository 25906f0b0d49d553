"""Trajectory consumer on a real Valkey stream: grouping, staleness, acks, restarts."""

from __future__ import annotations

import uuid

import redis

from training.rl.learner.consumer import TrajectoryConsumer
from training.rl.trajectory import Trajectory, Turn


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


def test_a_partial_rollout_counts_by_its_newest_turn(redis_url: str) -> None:
    """An episode that ran on across weight pushes (turns sampled by versions 2, 4 and 5)
    is kept while its newest turn is within the bound; the batch leaves out the turns
    older than the bound, and its reward still counts for the group."""
    from training.rl.learner.batch import build_batch
    from training.rl.learner.config import GRPOConfig

    client = redis.Redis.from_url(redis_url)
    stream = f"traj-{uuid.uuid4().hex}"
    consumer = TrajectoryConsumer(client, stream, "trainer", "c1", group_size=2, max_staleness=1)
    partial = _trajectory("a", 2, reward=1.0)
    partial.turns = [
        Turn(index=i, policy_version=v, prompt_token_ids=[1, 2], completion_token_ids=[3 + i],
             completion_logprobs=[-0.5])
        for i, v in enumerate((2, 4, 5))
    ]  # fmt: skip
    partial.policy_version_end = 5
    for trajectory in (partial, _trajectory("a", 5, reward=0.0), _trajectory("b", 3)):
        _publish(client, stream, trajectory)
    (group,) = consumer.poll(current_version=5, block_ms=10)
    assert group.trajectories[0].trajectory_id == partial.trajectory_id
    assert consumer.stats.dropped_stale == 1  # "b": its only turn is two versions behind

    batch = build_batch([group.trajectories], GRPOConfig(group_size=2), None, min_version=4)
    # Rows: the partial rollout's turns of versions 4 and 5, then the other's one turn.
    assert batch.completion_ids[:, 0].tolist() == [4, 5, 3]
    assert batch.advantages[:2].gt(0).all() and batch.rewards.tolist() == [1.0, 0.0]
