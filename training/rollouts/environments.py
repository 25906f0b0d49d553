"""Environments a rollout can run: feature-deletion coding tasks, and a small learnable one.

Each turns a request into a Trajectory: run the episode, score it, let the monitor veto
the reward, and mark the turns that targeted text feedback applies to.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from training.agent import (
    TOOL_NAMES,
    TOOL_SPECS,
    EpisodeConfig,
    EpisodeResult,
    Policy,
    TestOutcome,
    ToolResult,
    Trajectory,
    Turn,
    VersionGate,
    run_episode,
)
from training.monitor import EpisodeEvidence, check_episode, monitored_reward
from training.rl import TextFeedbackConfig, detect_feedback
from training.rollouts.request import RolloutRequest


class Environment(Protocol):
    name: str

    def run(self, request: RolloutRequest, policy: Policy, gate: VersionGate) -> Trajectory: ...


def _trajectory(
    request: RolloutRequest,
    result: EpisodeResult,
    raw_reward: float,
    evidence: EpisodeEvidence,
    feedback: TextFeedbackConfig,
) -> Trajectory:
    verdicts = check_episode(evidence)
    versions = [t.policy_version for t in result.turns] or [request.policy_version]
    return Trajectory(
        trajectory_id=uuid.uuid4().hex,
        rollout_id=request.rollout_id,
        task_id=request.task_id,
        environment=request.environment,
        policy_version_start=versions[0],
        policy_version_end=versions[-1],
        turns=result.turns,
        reward=monitored_reward(raw_reward, verdicts),
        raw_reward=raw_reward,
        tests=result.tests,
        verdicts=verdicts,
        feedback=detect_feedback(result.turns, TOOL_NAMES, feedback),
        invalid_tool_calls=result.invalid_tool_calls,
        tool_calls=result.tool_calls,
        ended_by=result.ended_by,
    )


@dataclass
class CodingEnvironment:
    """Feature-deletion tasks built by `cstack tasks build` under ``task_root``."""

    task_root: Path
    episode: EpisodeConfig
    feedback: TextFeedbackConfig
    name: str = "coding"

    def run(self, request: RolloutRequest, policy: Policy, gate: VersionGate) -> Trajectory:
        from training.tasks import evaluate_sandbox, load_task, task_reward

        task_dir = self.task_root / request.task_id
        task = load_task(task_dir)
        prompt = (
            f"In this repository the {task.feature.kind} `{task.feature.name}` in "
            f"`{task.feature.path}` was removed: it raises NotImplementedError. Implement it "
            "so that the test suite passes, then call finish."
        )
        result = run_episode(
            policy, gate, task_dir / "repo", prompt, self.episode, task.python_paths,
            evaluate=lambda root: evaluate_sandbox(task_dir, root),
        )  # fmt: skip
        originals = task_dir / "harness" / "original"
        evidence = EpisodeEvidence(
            commands=result.commands,
            changes=result.changes,
            test_sources={
                p: (originals / p).read_text(errors="replace")
                for p in task.test_files
                if p.endswith(".py")
            },
        )
        raw = task_reward(result.tests or TestOutcome())
        return _trajectory(request, result, raw, evidence, self.feedback)


_DIGIT = re.compile(r"\d")


@dataclass
class DigitsEnvironment:
    """One turn, rewarded by the share of digits in the reply: learnable by a tiny model.

    It exists so the whole loop (rollouts, GRPO, weight sync) can be shown to improve a
    policy on CPU, where the random-initialised tiny model cannot solve coding tasks.
    """

    feedback: TextFeedbackConfig
    name: str = "digits"

    def run(self, request: RolloutRequest, policy: Policy, gate: VersionGate) -> Trajectory:
        messages = [{"role": "user", "content": f"Reply with numbers only. ({request.task_id})"}]
        with gate() as version:
            completion = policy.complete(messages, TOOL_SPECS)
        text = completion.text
        visible = [c for c in text if not c.isspace()]
        reward = len(_DIGIT.findall(text)) / len(visible) if visible else 0.0
        invalid = sum(call.name not in TOOL_NAMES for call in completion.tool_calls)
        results = [
            ToolResult(call_id=c.call_id, name=c.name, ok=False,
                       content=f"Tool not found: {c.name!r}" if c.name not in TOOL_NAMES
                       else "Tools are not available in this environment.")
            for c in completion.tool_calls
        ]  # fmt: skip
        turn = Turn(
            index=0, policy_version=version, prompt_token_ids=completion.prompt_token_ids,
            completion_token_ids=completion.completion_token_ids,
            completion_logprobs=completion.logprobs, completion_text=text,
            finish_reason=completion.finish_reason, tool_calls=completion.tool_calls,
            tool_results=results,
        )  # fmt: skip
        result = EpisodeResult([turn], [], [], "single_turn", len(results), invalid, None)
        return _trajectory(request, result, reward, EpisodeEvidence(), self.feedback)
