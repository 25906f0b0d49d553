"""The RL loop on the trainer side: keep rollouts queued, train on fresh task groups,
push the new weights, advance the policy version.

Rollouts are asynchronous: while the trainer steps, workers keep sampling with the
policy version they were given; the consumer drops anything more than ``max_staleness``
versions behind, so off-policy drift stays bounded. Groups that arrive beyond a step's
need wait for the next step (while within that bound) instead of being thrown away.

Which task each new group samples is the curriculum's choice (``training.rl.learner.curriculum``),
and a group whose rollouts all got the same reward teaches nothing: with dynamic sampling
it is skipped (unless it carries text feedback, whose hint KL still teaches) and the
queue, topped up, samples another in its place.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from torch import Tensor

from serving.settings import CstackSettings
from training.rl.feedback import Encode
from training.rl.learner import metrics
from training.rl.learner.batch import build_batch
from training.rl.learner.config import GRPOConfig, WeightTransport
from training.rl.learner.consumer import TrajectoryConsumer, TrajectoryGroup
from training.rl.learner.curriculum import (
    Curriculum,
    CurriculumConfig,
    no_harder_variant,
    rewards_differ,
)
from training.rl.learner.trainer_hook import trainer_batch
from training.rl.rollouts.gate import PolicyVersionGate
from training.rl.rollouts.metrics import STALENESS
from training.rl.rollouts.request import RolloutRequest, TaskStyle

#: Groups skipped for equal rewards per group a step needs, after which the step trains on
#: what comes (when every task gives equal rewards, e.g. early coding runs all at 0, the
#: loop goes on instead of sampling until its timeout).
MAX_SKIPS_PER_GROUP = 4


class TrainerLike(Protocol):
    """What the loop needs of training.Trainer (kept narrow for the loop's own tests)."""

    @property
    def model(self) -> Callable[..., Tensor]: ...

    def train_step(self, batch: Mapping[str, Tensor]) -> object: ...

    def export(self, out: Path) -> None: ...

    def hf_weights(self) -> dict[str, Tensor]: ...


class WeightPush(Protocol):
    def push(self, checkpoint: Path) -> int: ...

    def push_weights(self, tensors: Mapping[str, Tensor]) -> int: ...


@dataclass(frozen=True)
class LoopConfig:
    environment: str = "digits"
    task_ids: tuple[str, ...] = ("digits-0", "digits-1", "digits-2", "digits-3")
    groups_per_step: int = 2
    queued_groups: int = 4
    #: How new weights reach the engines after a step: ``stream`` sends them in buckets
    #: over a process group (weight_transport.py), ``disk`` writes an HF export to
    #: ``export_dir`` that the engines read back.
    weight_transport: WeightTransport = "stream"
    export_dir: Path = field(default_factory=lambda: CstackSettings().state_dir / "rl" / "weights")
    keep_exports: int = 2
    #: Seeds vLLM's sampling of the k-th submitted rollout with ``sampling_seed * 10**6 + k``
    #: (None: unseeded), so two runs with the same seed draw the same random numbers, and
    #: the curriculum's draws. Which task the k-th group samples also depends on the order
    #: in which groups come back, which asynchronous workers do not fix.
    sampling_seed: int | None = None
    #: Per task id: the reasoning effort and verbosity its rollouts ask for (absent: none;
    #: a harder variant, ``ID@n``, asks for what ``ID`` does).
    task_styles: Mapping[str, TaskStyle] = field(default_factory=dict)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)


@dataclass(frozen=True)
class StepReport:
    step: int
    policy_version: int
    mean_reward: float
    invalid_tool_rate: float
    staleness: float
    rollouts_per_s: float
    tokens_per_s: float
    loss: float
    dropped_stale: int
    flagged_turns: int
    #: Distinct policy versions that produced the turns trained on (each turn records its own).
    turn_versions: tuple[int, ...] = ()
    #: Groups this step received whose rewards were all equal and that were not trained on
    #: (dynamic sampling), and those trained on anyway (sampling off, or text feedback).
    skipped_groups: int = 0
    zero_advantage_groups: int = 0
    #: Groups that arrived beyond this step's need and wait for the next one.
    carried_groups: int = 0
    #: Tasks still drawn and tasks retired as solved (the curriculum).
    active_tasks: int = 0
    retired_tasks: int = 0
    #: KL(engine || trainer) per trained token, from the engine's sampling logprobs and
    #: the trainer's before the step (kernels, precision and staleness all count), and
    #: the share of tokens whose importance ratio the correction capped.
    mismatch_kl: float = 0.0
    capped_share: float = 0.0
    #: The step's wall time; the seconds of it spent waiting for rollouts, and that share
    #: (the trainer idle).
    seconds: float = 0.0
    waited_s: float = 0.0
    trainer_idle_share: float = 0.0
    #: Rollouts received since the loop started (trained, skipped, carried or dropped).
    rollouts_received: int = 0
    #: On the turns that got text feedback: nats per token (all of their tokens) by which
    #: the hinted teacher makes them less likely than the policy does (None: no feedback
    #: this step).
    hint_teacher_margin: float | None = None


class RlLoop:
    def __init__(
        self,
        trainer: TrainerLike,
        consumer: TrajectoryConsumer,
        gate: PolicyVersionGate,
        weights: WeightPush,
        submit: Callable[[RolloutRequest], None],
        config: LoopConfig,
        encode: Encode,
        pad_id: int = 0,
        teacher: Callable[..., Tensor] | None = None,
        harder: Callable[[str], str | None] | None = None,
    ) -> None:
        """``harder``: the harder variant of a task id, if its environment has one (the
        curriculum adds it when the task is solved)."""
        self.trainer, self.consumer, self.gate = trainer, consumer, gate
        self.weights, self.submit, self.config = weights, submit, config
        self.encode, self.pad_id, self.teacher = encode, pad_id, teacher
        self.step = 0
        self._submitted_groups = 0
        self._submitted_rollouts = 0
        self.curriculum = Curriculum(
            config.task_ids, config.curriculum, harder or no_harder_variant, config.sampling_seed
        )
        self._carried: list[TrajectoryGroup] = []
        self._started = time.monotonic()

    def _in_flight_groups(self) -> int:
        """Groups submitted and not yet wholly received (a group some of whose rollouts
        are still out is in flight)."""
        done = self.consumer.stats.received + self.consumer.stats.dropped_malformed
        return self._submitted_groups - done // self.config.grpo.group_size

    def top_up(self, wanted: int | None = None) -> None:
        """Queue whole groups (same task, current version) until ``wanted`` are in flight
        (default: ``queued_groups``)."""
        version = self.gate.version()
        target = self.config.queued_groups if wanted is None else wanted
        while self._in_flight_groups() < target:
            task_id = self.curriculum.choose()
            styles = self.config.task_styles
            style = styles.get(task_id) or styles.get(task_id.partition("@")[0], TaskStyle())
            for _ in range(self.config.grpo.group_size):
                self.submit(RolloutRequest(
                    rollout_id=uuid.uuid4().hex, task_id=task_id,
                    environment=self.config.environment, policy_version=version,
                    seed=self._next_seed(), reasoning_effort=style.reasoning_effort,
                    verbosity=style.verbosity,
                ))  # fmt: skip
            self._submitted_groups += 1

    def _next_seed(self) -> int | None:
        self._submitted_rollouts += 1
        if self.config.sampling_seed is None:
            return None
        return self.config.sampling_seed * 10**6 + self._submitted_rollouts

    def run_step(self, timeout_s: float = 3600.0) -> StepReport:
        started = time.monotonic()
        version = self.gate.version()
        groups = self._fresh_carried(version)
        min_version = version - self.config.grpo.max_staleness
        skipped = 0
        deadline = started + timeout_s
        # Keep ``queued_groups`` ahead, counting those in hand (so a synchronous loop, whose
        # queue is one step, samples nothing the next push would make stale).
        self.top_up(self.config.queued_groups - len(groups))
        while len(groups) < self.config.groups_per_step:
            if time.monotonic() > deadline:
                raise TimeoutError("no fresh trajectory groups arrived in time")
            for group in self.consumer.poll(version, block_ms=500):
                self.curriculum.record(group.task_id, [t.reward for t in group.trajectories])
                teaches = self._teaches(group, min_version)
                if teaches or skipped >= MAX_SKIPS_PER_GROUP * self.config.groups_per_step:
                    groups.append(group)
                else:
                    self.consumer.ack(group.entry_ids)
                    skipped += 1
            self.top_up(self.config.queued_groups - len(groups))
        groups, extra = groups[: self.config.groups_per_step], groups[self.config.groups_per_step :]
        # Only groups that teach wait for the next step (the others came in past the cap).
        self._carried = []
        for group in extra:
            if self._teaches(group, min_version):
                self._carried.append(group)
            else:
                self.consumer.ack(group.entry_ids)
                skipped += 1
        waited = time.monotonic() - started
        trajectories = [t for g in groups for t in g.trajectories]
        grpo = self.config.grpo
        batch = build_batch(
            [g.trajectories for g in groups], grpo, self.encode, self.pad_id,
            min_version=min_version,
        )  # fmt: skip
        parallel = getattr(getattr(self.trainer, "config", None), "parallel", None)
        inputs = trainer_batch(
            batch, grpo, self.teacher or self.trainer.model,
            pad_id=self.pad_id,
            row_multiple=getattr(parallel, "data_parallel", 1),
            seq_multiple=getattr(parallel, "cp", 1),
        )  # fmt: skip
        stats = self.trainer.train_step(inputs)
        self.consumer.ack([e for g in groups for e in g.entry_ids])
        if self.config.weight_transport == "stream":
            new_version = self.weights.push_weights(self.trainer.hf_weights())
        else:
            export = self.config.export_dir / f"step-{self.step + 1:06d}"
            self.trainer.export(export)
            new_version = self.weights.push(export)
            self._prune_exports(export)
        self.step += 1
        staleness = [version - t.policy_version_start for t in trajectories]
        for value in staleness:
            STALENESS.observe(value)
        calls = sum(t.tool_calls for t in trajectories)
        invalid = sum(t.invalid_tool_calls for t in trajectories)
        elapsed = max(time.monotonic() - started, 1e-9)
        tokens = int(batch.completion_mask.sum())
        loss_metrics: Mapping[str, float] = getattr(stats, "loss_metrics", {})
        flagged_tokens = loss_metrics.get("flagged_tokens", 0.0)
        report = StepReport(
            step=self.step,
            policy_version=new_version,
            mean_reward=sum(t.reward for t in trajectories) / len(trajectories),
            invalid_tool_rate=invalid / calls if calls else 0.0,
            staleness=sum(staleness) / len(staleness),
            rollouts_per_s=len(trajectories) / elapsed,
            tokens_per_s=tokens / elapsed,
            loss=float(getattr(stats, "loss", 0.0)),
            dropped_stale=self.consumer.stats.dropped_stale,
            flagged_turns=int(batch.flagged_rows.numel()),
            turn_versions=tuple(
                sorted({turn.policy_version for t in trajectories for turn in t.turns})
            ),
            skipped_groups=skipped,
            zero_advantage_groups=sum(
                not rewards_differ([t.reward for t in g.trajectories]) for g in groups
            ),
            carried_groups=len(self._carried),
            active_tasks=len(self.curriculum.active()),
            retired_tasks=len(self.curriculum.tasks) - len(self.curriculum.active()),
            mismatch_kl=loss_metrics.get("mismatch_kl", 0.0) / max(tokens, 1),
            capped_share=loss_metrics.get("capped_tokens", 0.0) / max(tokens, 1),
            hint_teacher_margin=loss_metrics.get("hint_margin", 0.0) / flagged_tokens
            if flagged_tokens
            else None,
            seconds=elapsed,
            waited_s=waited,
            trainer_idle_share=waited / elapsed,
            rollouts_received=self.consumer.stats.received,
        )
        _publish(report)
        return report

    def _teaches(self, group: TrajectoryGroup, min_version: int) -> bool:
        """Whether a group is worth a gradient step (see the curriculum's dynamic
        sampling): its rewards differ, or its hint KL teaches."""
        rewards = [t.reward for t in group.trajectories]
        return self.curriculum.trains_on(rewards) or self._hint_teaches(group, min_version)

    def _hint_teaches(self, group: TrajectoryGroup, min_version: int) -> bool:
        """Whether a group whose rewards are equal still teaches by its hint KL: feedback
        is on and one of its flagged turns is recent enough to be trained on."""
        feedback = self.config.grpo.feedback
        if not (feedback.enabled and feedback.kl_coef > 0):
            return False
        for trajectory in group.trajectories:
            versions = {turn.index: turn.policy_version for turn in trajectory.turns}
            if any(versions.get(m.turn_index, -1) >= min_version for m in trajectory.feedback):
                return True
        return False

    def _fresh_carried(self, version: int) -> list[TrajectoryGroup]:
        """The groups carried from the last step that are still within the staleness bound
        (the others are dropped and acknowledged, as the consumer does)."""
        fresh, stale = [], []
        for group in self._carried:
            if any(self.consumer.is_stale(t, version) for t in group.trajectories):
                stale.append(group)
            else:
                fresh.append(group)
        if stale:
            self.consumer.stats.dropped_stale += sum(len(g.trajectories) for g in stale)
            self.consumer.ack([e for g in stale for e in g.entry_ids])
        self._carried = []
        return fresh

    def _prune_exports(self, current: Path) -> None:
        exports = sorted(p for p in self.config.export_dir.glob("step-*") if p.is_dir())
        for old in exports[: -self.config.keep_exports]:
            if old != current:
                shutil.rmtree(old, ignore_errors=True)


def _publish(report: StepReport) -> None:
    """The step's figures as the RL metrics (training.rl.learner.metrics)."""
    metrics.MISMATCH_KL.set(report.mismatch_kl)
    metrics.CAPPED_TOKEN_SHARE.set(report.capped_share)
    metrics.SKIPPED_GROUPS.inc(report.skipped_groups)
    metrics.TASKS.labels("active").set(report.active_tasks)
    metrics.TASKS.labels("retired").set(report.retired_tasks)
    if report.hint_teacher_margin is not None:
        metrics.HINT_TEACHER_MARGIN.set(report.hint_teacher_margin)
