"""The curriculum (``training.rl.learner.curriculum``) and the loop's use of it.

The curriculum alone: tasks drawn by how much they can still teach, solved tasks retired
for their harder variant, groups with equal rewards recognised. Then the loop on real
parts but the policy: the session's Valkey carries the rollout stream, the consumer and
the version gate are the real ones, and a scripted worker answers each rollout request
with the reward its task is scripted to earn, so which groups get trained on is exact.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import torch
from prometheus_client import REGISTRY

from training.rl.learner.config import GRPOConfig
from training.rl.learner.consumer import TrajectoryConsumer
from training.rl.learner.curriculum import Curriculum, CurriculumConfig
from training.rl.learner.loop import LoopConfig, RlLoop
from training.rl.rollouts.environments import harder_task, toolchoice_available
from training.rl.rollouts.gate import PolicyVersionGate
from training.rl.rollouts.request import RolloutRequest
from training.rl.trajectory import Trajectory, Turn


def test_tasks_are_drawn_by_what_they_can_still_teach() -> None:
    never_retire = CurriculumConfig(retire_after_groups=1000)
    curriculum = Curriculum(["solved", "hopeless", "coin"], never_retire, seed=0)
    for _ in range(10):
        curriculum.record("solved", [1, 1, 1, 1])
        curriculum.record("hopeless", [0, 0, 0, 0])
        curriculum.record("coin", [1, 0, 1, 0])
    draws = Counter(curriculum.choose() for _ in range(3000))
    assert draws["coin"] > 5 * max(draws["solved"], draws["hopeless"])
    assert min(draws["solved"], draws["hopeless"]) > 0  # the floor: rates drift

    uniform = Curriculum(["solved", "coin"], CurriculumConfig(sampling="uniform"), seed=0)
    for _ in range(10):
        uniform.record("solved", [1, 1])
    draws = Counter(uniform.choose() for _ in range(2000))
    assert abs(draws["solved"] - draws["coin"]) < 200
    assert uniform.active() == ["solved", "coin"]  # uniform retires nothing


def test_a_solved_task_retires_for_its_harder_variant() -> None:
    curriculum = Curriculum(
        ["tools-0", "tools-1"],
        CurriculumConfig(retire_after_groups=3),
        harder=lambda task_id: harder_task("toolchoice", Path("."), task_id),
        seed=0,
    )
    for _ in range(12):
        curriculum.record("tools-0", [1.0] * 4)
    assert curriculum.active() == ["tools-1", "tools-0@2"]
    for _ in range(12):
        curriculum.record("tools-0@2", [1.0] * 4)
    assert curriculum.active() == ["tools-1", "tools-0@1"]
    for _ in range(12):
        curriculum.record("tools-0@1", [1.0] * 4)
    assert curriculum.active() == ["tools-1"]  # one tool offered: nothing harder

    assert toolchoice_available("tools-0") == ["name", "item", "class", "lib"]
    assert toolchoice_available("tools-0@2") == ["name", "item"]
    assert harder_task("digits", Path("."), "digits-0") is None
    for bad in ("tools-0@0", "tools-0@12", "tools-x", "tool-0@1"):
        with pytest.raises(ValueError, match="tools-0@2"):
            toolchoice_available(bad)


def test_groups_with_equal_rewards_are_recognised() -> None:
    assert not Curriculum(["t"]).trains_on([1.0, 1.0, 1.0])
    assert Curriculum(["t"]).trains_on([1.0, 0.5, 1.0])
    off = Curriculum(["t"], CurriculumConfig(dynamic_sampling=False))
    assert off.trains_on([0.0, 0.0])


# -- the loop ------------------------------------------------------------------------------

#: Each task's rewards, by the rollout's index within its group.
SCRIPT = {"solved": [1.0] * 4, "hopeless": [0.0] * 4, "coin": [1.0, 0.0, 1.0, 0.0]}


class ScriptedWorker:
    """Answers each rollout request at once with its task's scripted reward."""

    def __init__(self, client: redis.Redis, stream: str) -> None:
        self.client, self.stream = client, stream
        self.requests: list[RolloutRequest] = []

    def __call__(self, request: RolloutRequest) -> None:
        index = sum(r.task_id == request.task_id for r in self.requests) % 4
        self.requests.append(request)
        reward = SCRIPT[request.task_id][index]
        turn = Turn(
            index=0, policy_version=request.policy_version, prompt_token_ids=[1, 2],
            completion_token_ids=[3, 4], completion_logprobs=[-0.5, -0.7],
        )  # fmt: skip
        trajectory = Trajectory(
            trajectory_id=request.rollout_id, rollout_id=request.rollout_id,
            task_id=request.task_id, environment="scripted",
            policy_version_start=request.policy_version,
            policy_version_end=request.policy_version, turns=[turn], reward=reward,
            raw_reward=reward,
        )  # fmt: skip
        self.client.xadd(self.stream, {"trajectory": trajectory.model_dump_json()})


class RecordingTrainer:
    """Keeps the batches it is given; the policy's forward is never needed (no hints)."""

    def __init__(self) -> None:
        self.batches: list[Mapping[str, torch.Tensor]] = []

    def model(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("no feedback here: the teacher is never asked")

    def train_step(self, batch: Mapping[str, torch.Tensor]) -> object:
        self.batches.append(batch)
        return SimpleNamespace(loss=0.0)

    def export(self, out: Path) -> None:
        raise AssertionError("weights are streamed")

    def hf_weights(self) -> dict[str, torch.Tensor]:
        return {}


class VersionPush:
    def __init__(self, gate: PolicyVersionGate) -> None:
        self.gate = gate

    def push(self, checkpoint: Path) -> int:
        raise AssertionError("weights are streamed")

    def push_weights(self, tensors: Mapping[str, torch.Tensor]) -> int:
        self.gate.set_version(self.gate.version() + 1)
        return self.gate.version()


def run_loop(
    redis_url: str,
    curriculum: CurriculumConfig,
    steps: int,
    max_staleness: int = 2,
    tasks: tuple[str, ...] = tuple(SCRIPT),
) -> tuple[Any, ...]:
    client = redis.Redis.from_url(redis_url)
    stream = f"traj-{uuid.uuid4().hex}"
    gate = PolicyVersionGate(client, f"{stream}:policy")
    gate.set_version(0)
    consumer = TrajectoryConsumer(client, stream, "trainer", "t0", 4, max_staleness)
    worker = ScriptedWorker(client, stream)
    trainer = RecordingTrainer()
    loop = RlLoop(
        trainer, consumer, gate, VersionPush(gate), worker,
        LoopConfig(environment="scripted", task_ids=tasks, groups_per_step=2,
                   queued_groups=4 if max_staleness else 2, sampling_seed=0,
                   grpo=GRPOConfig(group_size=4, max_staleness=max_staleness),
                   curriculum=curriculum),
        encode=lambda text: [1] * len(text),
    )  # fmt: skip
    reports = [loop.run_step(timeout_s=60) for _ in range(steps)]
    pending = client.xpending(stream, "trainer")["pending"]
    return reports, trainer, worker, loop, pending


def test_the_loop_trains_only_on_groups_that_teach_and_keeps_the_rest_for_later(
    redis_url: str,
) -> None:
    skipped_before = REGISTRY.get_sample_value("cstack_rl_skipped_groups_total") or 0.0
    reports, trainer, worker, loop, pending = run_loop(redis_url, CurriculumConfig(), steps=6)
    skipped = sum(r.skipped_groups for r in reports)
    assert REGISTRY.get_sample_value("cstack_rl_skipped_groups_total") == skipped_before + skipped
    assert REGISTRY.get_sample_value("cstack_rl_tasks", {"state": "active"}) == len(
        loop.curriculum.active()
    )
    assert all(r.zero_advantage_groups == 0 for r in reports)
    assert skipped > 0
    for batch in trainer.batches:  # every trained row has an advantage
        assert bool((batch["advantages"].abs().sum(dim=1) > 0).all())
    # The draw moved to the task that teaches.
    later = Counter(r.task_id for r in worker.requests[len(worker.requests) // 2 :])
    assert later["coin"] > later["solved"] + later["hopeless"]
    rates = {t: loop.curriculum.tasks[t].pass_rate for t in SCRIPT}
    assert rates["solved"] > 0.5 > rates["hopeless"]
    # Groups beyond a step's need wait for the next; their entries stay unacknowledged.
    assert reports[-1].carried_groups * 4 == pending


def test_without_dynamic_sampling_uniform_groups_are_trained_on(redis_url: str) -> None:
    config = CurriculumConfig(sampling="uniform", dynamic_sampling=False)
    reports, *_ = run_loop(redis_url, config, steps=4)
    assert sum(r.zero_advantage_groups for r in reports) > 0
    assert sum(r.skipped_groups for r in reports) == 0


def test_a_synchronous_loop_samples_only_what_each_step_needs(redis_url: str) -> None:
    """With no staleness allowed, nothing is sampled ahead for the next step (the push
    would make it stale): every rollout is trained on or skipped, none dropped."""
    reports, _, worker, _, pending = run_loop(
        redis_url, CurriculumConfig(), steps=4, max_staleness=0
    )
    assert all(r.dropped_stale == 0 and r.carried_groups == 0 for r in reports)
    skipped = sum(r.skipped_groups for r in reports)
    assert len(worker.requests) == (4 * 2 + skipped) * 4
    assert pending == 0


def test_when_every_group_has_equal_rewards_the_loop_goes_on(redis_url: str) -> None:
    """Nothing to learn anywhere: after 4 skips per group needed, the step trains on what
    comes instead of sampling until its timeout."""
    reports, *_ = run_loop(redis_url, CurriculumConfig(), steps=2, tasks=("hopeless",))
    assert all(r.skipped_groups >= 8 for r in reports)  # and those past the cap: not carried
    assert [r.zero_advantage_groups for r in reports] == [2, 2]
    assert all(r.carried_groups == 0 for r in reports)
