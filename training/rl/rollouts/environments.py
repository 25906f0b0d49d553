"""Environments a rollout can run: feature-deletion coding tasks, and a small learnable one.

Each turns a request into a Trajectory: run the episode, score it, let the monitor veto
the reward, and mark the turns that targeted text feedback applies to.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from training.rl.agent import (
    TOOL_NAMES,
    TOOL_SPECS,
    EpisodeConfig,
    EpisodeResult,
    Policy,
    VersionGate,
    run_episode,
)
from training.rl.feedback import TextFeedbackConfig, detect_feedback
from training.rl.monitor import EpisodeEvidence, check_episode
from training.rl.monitor.review import ReviewConfig, ReviewerModel, review_episode, review_trigger
from training.rl.rewards import (
    digits_reward,
    final_reward,
    task_reward,
    toolchoice_reward,
    with_review,
)
from training.rl.rollouts.request import RolloutRequest
from training.rl.trajectory import (
    Review,
    TestOutcome,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
    Verdict,
)


class Environment(Protocol):
    name: str

    def run(self, request: RolloutRequest, policy: Policy, gate: VersionGate) -> Trajectory: ...


def _trajectory(
    request: RolloutRequest,
    result: EpisodeResult,
    raw_reward: float,
    evidence: EpisodeEvidence,
    feedback: TextFeedbackConfig,
    tool_names: Sequence[str] = TOOL_NAMES,
    verdicts: list[Verdict] | None = None,
    review: Review | None = None,
) -> Trajectory:
    verdicts = with_review(check_episode(evidence) if verdicts is None else verdicts, review)
    versions = [t.policy_version for t in result.turns] or [request.policy_version]
    return Trajectory(
        trajectory_id=uuid.uuid4().hex,
        rollout_id=request.rollout_id,
        task_id=request.task_id,
        environment=request.environment,
        policy_version_start=versions[0],
        policy_version_end=versions[-1],
        turns=result.turns,
        reward=final_reward(raw_reward, verdicts),
        raw_reward=raw_reward,
        tests=result.tests,
        verdicts=verdicts,
        review=review,
        feedback=detect_feedback(result.turns, tool_names, feedback),
        invalid_tool_calls=result.invalid_tool_calls,
        tool_calls=result.tool_calls,
        ended_by=result.ended_by,
    )


@dataclass
class CodingEnvironment:
    """Feature-deletion tasks built by `cstack tasks build` under ``task_root``.

    With a ``reviewer``, episodes the rules flag or that earn fast are also reviewed by it
    (``training.rl.monitor.review``); ``reviewer_name`` is stored with each review.
    """

    task_root: Path
    episode: EpisodeConfig
    feedback: TextFeedbackConfig
    name: str = "coding"
    reviewer: ReviewerModel | None = None
    reviewer_name: str = ""
    review: ReviewConfig = field(default_factory=ReviewConfig)

    def run(self, request: RolloutRequest, policy: Policy, gate: VersionGate) -> Trajectory:
        from training.rl.agent.trees import TreeCaps, walk
        from training.rl.tasks.builder import load_task
        from training.rl.tasks.scoring import evaluate_sandbox, protected_modules

        task_dir = self.task_root / request.task_id
        task = load_task(task_dir)
        removed = [task.feature, *task.also_removed]
        named = " and the ".join(f"{f.kind} `{f.name}` in `{f.path}`" for f in removed)
        if len(removed) == 1:
            what = f"the {named} was removed: it raises NotImplementedError. Implement it"
        else:
            what = f"the {named} were removed: they raise NotImplementedError. Implement them"
        prompt = f"In this repository {what} so that the test suite passes, then call finish."
        result = run_episode(
            policy, gate, task_dir / "repo", prompt, self.episode, task.python_paths,
            evaluate=lambda root: evaluate_sandbox(task_dir, root), dependencies=task.dependencies,
        )  # fmt: skip
        originals = task_dir / "harness" / "original"
        tree = [path for path, size in walk(task_dir / "repo", TreeCaps()) if size is not None]
        evidence = EpisodeEvidence(
            commands=result.commands,
            changes=result.changes,
            versions=result.versions,
            tree=tree,
            protected_modules=sorted(protected_modules(task)),
            test_sources={
                p: (originals / p).read_text(errors="replace")
                for p in task.test_files
                if p.endswith(".py")
            },
        )
        raw = task_reward(result.tests or TestOutcome())
        verdicts = check_episode(evidence)
        review = None
        trigger = review_trigger(verdicts, raw, len(result.turns), self.review)
        if self.reviewer is not None and trigger is not None:
            review = review_episode(
                self.reviewer, self.reviewer_name, prompt, evidence, verdicts, trigger, self.review
            )
        return _trajectory(request, result, raw, evidence, self.feedback, verdicts=verdicts,
                           review=review)  # fmt: skip


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
        reward = digits_reward(text)
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
        result = EpisodeResult([turn], [], [], [], "single_turn", len(results), invalid, None)
        return _trajectory(request, result, reward, EpisodeEvidence(), self.feedback)


#: Single-token names whose token also appears verbatim inside a hint that lists them, so a
#: small model can learn to copy a listed name (see bench/rl_toolchoice.py).
TOOLCHOICE_TOOLS = ("name", "item", "class", "lib", "day", "ment", "ver", "ror")


def toolchoice_available(task_id: str) -> list[str]:
    """Task ``tools-k`` offers four of the eight names; neighbouring tasks share two.
    Its harder variant ``tools-k@n`` offers only the first ``n`` of those four."""
    base, _, offered = task_id.partition("@")
    prefix, _, index = base.rpartition("-")
    if prefix != "tools" or not index.isdigit() or offered not in ("", "1", "2", "3", "4"):
        raise ValueError(f"toolchoice task ids look like 'tools-0' or 'tools-0@2', not {task_id!r}")
    start = 2 * (int(index) % 4)
    names = [TOOLCHOICE_TOOLS[(start + i) % len(TOOLCHOICE_TOOLS)] for i in range(4)]
    return names[: int(offered)] if offered else names


def harder_task(environment: str, task_root: Path, task_id: str) -> str | None:
    """The harder variant of a task, which the curriculum adds once the task is solved
    (None: there is none). toolchoice: half as many tools offered, down to one. coding:
    the variant `cstack tasks build` made of it (its feature and another deleted), if it
    is in ``task_root``."""
    if environment == "toolchoice":
        offered = len(toolchoice_available(task_id))
        return f"{task_id.partition('@')[0]}@{offered // 2}" if offered > 1 else None
    if environment == "coding":
        from training.rl.tasks.builder import TASK_FILE, load_task

        harder = load_task(task_root / task_id).harder
        return harder if harder and (task_root / harder / TASK_FILE).is_file() else None
    return None


def toolchoice_prompt(task_id: str) -> str:
    return f"Call one tool. ({task_id})"


def toolchoice_hint(tool_names: Sequence[str], feedback: TextFeedbackConfig) -> str:
    """The hint detect_feedback inserts for an unknown tool, for these available tools."""
    trigger = next(t for t in feedback.triggers if t.unknown_tool)
    return trigger.hint.format(tools=", ".join(tool_names))


@dataclass
class ToolChoiceEnvironment:
    """One turn whose reply is a tool name: reward 1 for a tool the task offers.

    The prompt does not list the task's tools; calling one it lacks is answered "Tool not
    found", which is what targeted text feedback's ``unknown_tool`` trigger fires on. Small
    enough for the tiny model on CPU, and the invalid-tool-call rate is its whole story.
    """

    feedback: TextFeedbackConfig
    name: str = "toolchoice"

    def run(self, request: RolloutRequest, policy: Policy, gate: VersionGate) -> Trajectory:
        available = toolchoice_available(request.task_id)
        messages = [{"role": "user", "content": toolchoice_prompt(request.task_id)}]
        with gate() as version:
            completion = policy.complete(messages, [])
        called = completion.text.strip()
        calls, results = [], []
        if called in TOOLCHOICE_TOOLS:
            valid = called in available
            calls = [ToolCall(call_id="call-0", name=called, arguments="{}")]
            reply = "ok" if valid else f"Tool not found: {called!r}"
            results = [ToolResult(call_id="call-0", name=called, ok=valid, content=reply)]
        invalid = sum(not r.ok for r in results)
        turn = Turn(
            index=0, policy_version=version, prompt_token_ids=completion.prompt_token_ids,
            completion_token_ids=completion.completion_token_ids,
            completion_logprobs=completion.logprobs, completion_text=completion.text,
            finish_reason=completion.finish_reason, tool_calls=calls, tool_results=results,
        )  # fmt: skip
        reward = toolchoice_reward(available, completion.text)
        result = EpisodeResult([turn], [], [], [], "single_turn", len(calls), invalid, None)
        return _trajectory(
            request, result, reward, EpisodeEvidence(), self.feedback, tool_names=available
        )
