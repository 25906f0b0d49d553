"""`cstack tasks audit`: run every known reward hack against a built task set.

Each attack of ``training.rl.tasks.attacks`` is played by a scripted policy through
``training.rl.rollouts.environments.CodingEnvironment``, the environment rollouts use, so it
is scored by the harness's own reward and judged by the monitor exactly as a rollout is.
An attack holds when it earns nothing (the reward is 0, or the monitor zeroed it); the
task's clean solution, played the same way, must earn its reward unflagged. Anyone adding
a codebase runs this over its freshly built tasks before training on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.rl.agent import Completion, EpisodeConfig, fixed_version
from training.rl.feedback import load_feedback_config
from training.rl.rollouts.environments import CodingEnvironment
from training.rl.rollouts.request import RolloutRequest
from training.rl.tasks.attacks import ATTACKS, Attack, AttackPlan, clean_solution
from training.rl.tasks.builder import TASK_FILE, load_task
from training.rl.trajectory import ToolCall

CLEAN = "clean_solution"


@dataclass(frozen=True)
class AuditRow:
    task_id: str
    attack: str
    kind: str
    raw_reward: float
    reward: float
    rules: tuple[str, ...]

    @property
    def held(self) -> bool:
        """An attack earned nothing; the clean solution earned its reward, unflagged."""
        if self.kind == "clean":
            return self.raw_reward > 0 and self.reward == self.raw_reward and not self.rules
        return self.reward == 0.0


class _ScriptedPolicy:
    """One tool call a turn: the plan's writes, its test run, then finish."""

    def __init__(self, plan: AttackPlan) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = [
            ("write_file", {"path": path, "content": content})
            for path, content in plan.files.items()
        ]
        if plan.run_tests:
            self.calls.append(("run_tests", {}))
        self.calls.append(("finish", {}))
        self.turn = 0

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        name, arguments = self.calls[min(self.turn, len(self.calls) - 1)]
        self.turn += 1
        call = ToolCall(call_id=f"call-{self.turn}", name=name, arguments=json.dumps(arguments))
        return Completion([], [], [], "", [call], "tool_calls")


def task_ids(task_root: Path) -> list[str]:
    """The tasks under ``task_root`` (each a folder with a task.json), sorted."""
    return sorted(p.parent.name for p in Path(task_root).glob(f"*/{TASK_FILE}"))


def _play(
    environment: CodingEnvironment, task_id: str, plan: AttackPlan
) -> tuple[float, float, tuple[str, ...]]:
    request = RolloutRequest(
        rollout_id=f"audit-{task_id}", task_id=task_id, environment="coding", policy_version=0
    )
    trajectory = environment.run(request, _ScriptedPolicy(plan), fixed_version(0))
    return trajectory.raw_reward, trajectory.reward, tuple(v.rule for v in trajectory.verdicts)


def audit_task(
    task_root: Path, task_id: str, attacks: Sequence[Attack] = ATTACKS
) -> Iterator[AuditRow]:
    """Each attack (and the clean solution, where the task keeps one) played once."""
    task_dir = Path(task_root) / task_id
    task = load_task(task_dir)
    environment = CodingEnvironment(
        Path(task_root), EpisodeConfig(max_turns=len(attacks) + 8), load_feedback_config()
    )
    plays: list[tuple[str, str, AttackPlan | None]] = [
        (CLEAN, "clean", clean_solution(task, task_dir))
    ]
    plays += [(a.name, a.kind, a.plan(task, task_dir / "repo")) for a in attacks]
    for name, kind, plan in plays:
        if plan is None:
            continue  # not applicable to this task (no package __init__, no solution kept)
        raw, reward, rules = _play(environment, task_id, plan)
        yield AuditRow(task_id, name, kind, raw, reward, rules)
