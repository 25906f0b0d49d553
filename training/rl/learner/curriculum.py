"""Which task the next group trains on: the ones the policy can still learn from.

A GRPO group teaches only where its rollouts disagree: a task the policy always solves, or
never does, gives every rollout the same reward, an advantage of zero and no gradient,
while costing a whole group of rollouts. So each task keeps a pass rate ``p`` (a moving
average over its recent groups) and is drawn with weight ``p (1 - p)``, the variance of
its reward, largest at a coin flip; a floor keeps every task in sight, since rates drift
as the policy learns. A task whose pass rate reaches ``retire_at`` (after at least
``retire_after_groups`` groups; from the prior, the default smoothing needs 7 groups in a
row that all pass) is retired and its harder variant, if its environment has one, joins
in its place. ``uniform`` draws every task alike, for comparison.

Nothing here imports torch or talks to a service: the loop records each group's rewards
and asks for the next task.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from training.trainer.options import option

Sampling = Literal["learnability", "uniform"]


@dataclass(frozen=True)
class CurriculumConfig:
    """How tasks are drawn and when groups are trained on."""

    sampling: Sampling = option(
        "learnability",
        "learnability: tasks drawn by p(1-p) of their pass rate, solved tasks retired; "
        "uniform: every task alike",
    )
    dynamic_sampling: bool = option(
        True,
        "skip groups whose rollouts all got the same reward (no advantage, no gradient) "
        "and sample another in their place",
    )
    #: A rollout passes when its reward reaches this (coding: every target test passes).
    pass_reward: float = 1.0
    #: Weight of a task's newest group in its pass rate (an exponential moving average).
    rate_smoothing: float = 0.3
    #: The pass rate of a task not yet seen.
    prior_pass_rate: float = 0.5
    #: The least weight of a task, so that none is starved while rates drift.
    min_weight: float = 0.02
    #: A task whose pass rate reaches this after this many groups is retired.
    retire_at: float = 0.95
    retire_after_groups: int = 4


def no_harder_variant(task_id: str) -> None:
    """For environments whose tasks have no harder variant."""
    return None


def rewards_differ(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards give it any advantage (GRPO: not all equal)."""
    return max(rewards) != min(rewards)


@dataclass
class TaskRecord:
    pass_rate: float
    groups: int = 0
    retired: bool = False


@dataclass
class Curriculum:
    """Draws tasks (``choose``) and learns their pass rates from groups (``record``).

    ``harder``: the harder variant of a task id (None: it has none), added to the draw
    when the task is retired.
    """

    task_ids: Sequence[str]
    config: CurriculumConfig = field(default_factory=CurriculumConfig)
    harder: Callable[[str], str | None] = no_harder_variant
    seed: int | None = None
    tasks: dict[str, TaskRecord] = field(init=False)

    def __post_init__(self) -> None:
        if not self.task_ids:
            raise ValueError("a curriculum needs at least one task")
        self.tasks = {t: TaskRecord(self.config.prior_pass_rate) for t in self.task_ids}
        self._random = random.Random(self.seed)

    def active(self) -> list[str]:
        return [task_id for task_id, record in self.tasks.items() if not record.retired]

    def weight(self, task_id: str) -> float:
        if self.config.sampling == "uniform":
            return 1.0
        rate = self.tasks[task_id].pass_rate
        return max(rate * (1.0 - rate), self.config.min_weight)

    def choose(self) -> str:
        active = self.active()
        if not active:  # everything retired and nothing harder: keep training on all
            active = list(self.tasks)
        weights = [self.weight(task_id) for task_id in active]
        return self._random.choices(active, weights)[0]

    def record(self, task_id: str, rewards: Sequence[float]) -> None:
        """One group's rewards for ``task_id``: its pass rate moves, and it may retire."""
        record = self.tasks.setdefault(task_id, TaskRecord(self.config.prior_pass_rate))
        passed = sum(reward >= self.config.pass_reward for reward in rewards) / len(rewards)
        alpha = self.config.rate_smoothing
        record.pass_rate = (1 - alpha) * record.pass_rate + alpha * passed
        record.groups += 1
        if (
            self.config.sampling == "learnability"
            and not record.retired
            and record.groups >= self.config.retire_after_groups
            and record.pass_rate >= self.config.retire_at
        ):
            record.retired = True
            variant = self.harder(task_id)
            if variant is not None and variant not in self.tasks:
                self.tasks[variant] = TaskRecord(self.config.prior_pass_rate)

    def trains_on(self, rewards: Sequence[float]) -> bool:
        """Whether a group is worth a gradient step: its rewards differ (or dynamic
        sampling is off)."""
        return not self.config.dynamic_sampling or rewards_differ(rewards)
