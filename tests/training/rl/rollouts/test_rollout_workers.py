"""Rollout workers: real Celery worker processes, real Valkey, the session's real vLLM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from serving.process import free_port
from training.rl.rollouts.gate import PolicyVersionGate
from training.rl.rollouts.publish import TrajectoryPublisher
from training.rl.rollouts.request import RolloutRequest
from training.rl.trajectory import Trajectory, Turn


def _trajectory(rollout_id: str) -> Trajectory:
    turn = Turn(index=0, policy_version=0, prompt_token_ids=[1], completion_token_ids=[2],
                completion_logprobs=[-1.0])  # fmt: skip
    return Trajectory(trajectory_id=uuid.uuid4().hex, rollout_id=rollout_id, task_id="t",
                      environment="digits", policy_version_start=0, policy_version_end=0,
                      turns=[turn], reward=0.0, raw_reward=0.0)  # fmt: skip


def test_publishing_is_once_per_rollout(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    stream = f"traj-{uuid.uuid4().hex}"
    publisher = TrajectoryPublisher(client, stream)
    first = publisher.publish(_trajectory("r1"))
    again = publisher.publish(_trajectory("r1"))  # a redelivered rollout, new trajectory id
    assert first == again == publisher.published_entry("r1")
    publisher.publish(_trajectory("r2"))
    assert client.xlen(stream) == 2


def test_gate_holds_turns_during_a_sync(redis_url: str) -> None:
    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), prefix=f"p-{uuid.uuid4().hex}")
    events: list[str] = []
    with gate.turn() as version:
        assert version == 0

        def sync() -> None:
            with gate.exclusive(drain_timeout_s=30):
                events.append("sync")
                gate.set_version(1)

        syncer = threading.Thread(target=sync)
        syncer.start()
        time.sleep(0.3)
        events.append("turn ends")  # the sync waits for this in-flight turn
    syncer.join(timeout=30)
    assert events == ["turn ends", "sync"]
    with gate.turn() as version:
        assert version == 1


def _stream_rollouts(client: redis.Redis, stream: str) -> list[str]:
    entries = client.xrange(stream)
    return [Trajectory.model_validate_json(data[b"trajectory"]).rollout_id for _, data in entries]


@pytest.fixture
def worker_env(redis_url: str, vllm_url: str) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return {
        **os.environ,
        "CSTACK_REDIS_URL": redis_url,
        "CSTACK_RL_POLICY_URL": f"{vllm_url}/v1",
        "CSTACK_RL_MAX_TOKENS": "12",
        "CSTACK_RL_ROLLOUT_QUEUE": f"rollouts-{suffix}",
        "CSTACK_RL_TRAJECTORY_STREAM": f"traj-{suffix}",
        "CSTACK_RL_ROLLOUT_REDELIVER_S": "4",
        "CSTACK_RL_METRICS_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture
def start_worker(worker_env: dict[str, str], tmp_path: Path) -> Iterator[object]:
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "training.rl.rollouts.worker:celery_app",
             "worker", "--concurrency=1", "--pool=prefork", "--without-gossip",
             "--without-mingle", "--loglevel=info", f"-Q{worker_env['CSTACK_RL_ROLLOUT_QUEUE']}",
             f"--hostname={name}@%h"],
            env=worker_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.vllm
def test_worker_killed_mid_episode_loses_and_duplicates_nothing(
    worker_env: dict[str, str], start_worker: object, redis_url: str
) -> None:
    from training.rl.rollouts.worker import TASK_NAME, make_celery
    from training.settings import TrainingSettings

    settings = TrainingSettings(
        redis_url=redis_url, rl_rollout_queue=worker_env["CSTACK_RL_ROLLOUT_QUEUE"]
    )
    app = make_celery(settings)
    client = redis.Redis.from_url(redis_url)
    stream = worker_env["CSTACK_RL_TRAJECTORY_STREAM"]
    requests = [
        RolloutRequest(rollout_id=f"r{i}-{uuid.uuid4().hex[:6]}", task_id=f"task{i % 2}",
                       environment="digits", policy_version=0)
        for i in range(6)
    ]  # fmt: skip
    for request in requests:
        app.send_task(TASK_NAME, args=[request.model_dump()], queue=settings.rl_rollout_queue)

    first = start_worker("first")  # type: ignore[operator]
    deadline = time.monotonic() + 300
    while client.xlen(stream) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.xlen(stream) >= 2, "the first worker published nothing"
    os.killpg(first.pid, signal.SIGKILL)  # parent and child: mid-episode, no ack sent
    first.wait()
    assert client.hlen("unacked") >= 1, "no delivery was in flight when the worker died"
    killed_at = client.xlen(stream)

    start_worker("second")  # type: ignore[operator]
    while client.xlen(stream) < len(requests) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(6)  # longer than the redelivery timeout: any duplicate would show up now
    published = _stream_rollouts(client, stream)
    assert sorted(published) == sorted(r.rollout_id for r in requests)
    assert killed_at < len(requests)
    # The surviving worker's pool process serves the rollout metrics (base port + index 0).
    metrics = httpx.get(f"http://127.0.0.1:{worker_env['CSTACK_RL_METRICS_PORT']}/metrics").text
    finished = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith('cstack_rollouts_total{env="digits"}')
    ]
    assert finished and finished[0] >= len(requests) - killed_at
    assert 'cstack_rollout_reward_count{env="digits"}' in metrics
    for _, data in client.xrange(stream):
        trajectory = Trajectory.model_validate_json(data[b"trajectory"])
        (turn,) = trajectory.turns
        assert len(turn.completion_token_ids) == len(turn.completion_logprobs) > 0
        assert 0.0 <= trajectory.reward <= 1.0
