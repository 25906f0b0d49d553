"""The agentic review of suspicious episodes: scripted reviewers through the coding
environment (what triggers a review, what a verdict does to the reward, what is stored),
and the tiny model through the real vLLM as a reviewer that answers nothing useful."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from training.rl.agent import Completion, EpisodeConfig, fixed_version
from training.rl.feedback import load_feedback_config
from training.rl.monitor import EpisodeEvidence, FileChange
from training.rl.monitor.review import ChatReviewer, ReviewConfig, review_episode
from training.rl.rollouts.environments import CodingEnvironment
from training.rl.rollouts.request import RolloutRequest
from training.rl.tasks.builder import BuildConfig, build_tasks
from training.rl.trajectory import ToolCall, Trajectory

FIXTURE = Path(__file__).resolve().parents[1] / "tasks" / "fixture_repo"


class Scripted:
    """Plays a list of turns (each a list of (tool, arguments)); records what it saw."""

    def __init__(self, turns: list[list[tuple[str, dict[str, Any]]]]) -> None:
        self.turns = turns
        self.seen: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        self.seen.append([dict(m) for m in messages])
        script = self.turns[min(len(self.seen) - 1, len(self.turns) - 1)]
        calls = [ToolCall(call_id=f"c{len(self.seen)}{i}", name=n, arguments=json.dumps(a))
                 for i, (n, a) in enumerate(script)]  # fmt: skip
        return Completion([], [], [], "", calls, "tool_calls")


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("tasks")
    config = BuildConfig(max_tasks=1, only=("to_roman",), source_name="textkit")
    (task,) = build_tasks(FIXTURE, out, config).tasks
    return out, task.task_id


def _episode(task_root: tuple[Path, str], policy: Scripted, reviewer: Scripted) -> Trajectory:
    root, task_id = task_root
    env = CodingEnvironment(root, EpisodeConfig(max_turns=4), load_feedback_config(),
                            reviewer=reviewer, reviewer_name="scripted-reviewer",
                            review=ReviewConfig(fast_turns=2, max_turns=4))  # fmt: skip
    request = RolloutRequest(rollout_id="r", task_id=task_id, environment="coding",
                             policy_version=1)  # fmt: skip
    return env.run(request, policy, fixed_version(1))


FIXED = (FIXTURE / "textkit" / "roman.py").read_text()


def test_a_fast_solve_is_reviewed_and_a_hack_verdict_zeroes_it(
    task_root: tuple[Path, str],
) -> None:
    """Unflagged by the rules, solved in two turns: the reviewer reads and decides."""
    policy = Scripted([[("write_file", {"path": "textkit/roman.py", "content": FIXED})],
                       [("finish", {})]])  # fmt: skip
    reviewer = Scripted([
        [("list_files", {}), ("read_diff", {"path": "textkit/roman.py"})],
        [("verdict", {"decision": "hack", "reason": "pasted a known implementation"})],
    ])  # fmt: skip
    trajectory = _episode(task_root, policy, reviewer)
    assert trajectory.raw_reward == 1.0 and trajectory.reward == 0.0
    assert trajectory.review is not None
    assert trajectory.review.verdict == "hack"
    assert trajectory.review.reviewer == "scripted-reviewer"
    assert trajectory.review.trigger == "earned 1.00 in 2 turns"
    assert [v.rule for v in trajectory.verdicts] == ["reviewer"]
    # The reviewer's tools answered from the episode's own record.
    answers = [m["content"] for m in reviewer.seen[-1] if m["role"] == "tool"]
    assert "textkit/roman.py: edited, 1 version(s)" in answers[0]
    assert "+    numeral_parts = []" in answers[1]


def test_a_clean_verdict_never_lifts_a_rule(task_root: tuple[Path, str]) -> None:
    policy = Scripted([[("write_file", {"path": "tests/test_roman.py", "content": "x = 1\n"})],
                       [("finish", {})]])  # fmt: skip
    reviewer = Scripted([[("rule_findings", {})],
                         [("verdict", {"decision": "clean", "reason": "looks fine"})]])  # fmt: skip
    trajectory = _episode(task_root, policy, reviewer)
    assert trajectory.review is not None and trajectory.review.verdict == "clean"
    assert trajectory.review.trigger == "flagged by test_tampering"
    assert trajectory.reward == 0.0 and [v.rule for v in trajectory.verdicts] == ["test_tampering"]
    findings = [m["content"] for m in reviewer.seen[-1] if m["role"] == "tool"]
    assert findings[0].startswith("test_tampering: tests/test_roman.py")


def test_a_slow_unflagged_episode_is_not_reviewed(task_root: tuple[Path, str]) -> None:
    policy = Scripted([[("read_file", {"path": "textkit/roman.py"})],
                       [("list_dir", {"path": "."})],
                       [("write_file", {"path": "textkit/roman.py", "content": FIXED})],
                       [("finish", {})]])  # fmt: skip
    reviewer = Scripted([[("verdict", {"decision": "hack", "reason": "never asked"})]])
    trajectory = _episode(task_root, policy, reviewer)
    assert trajectory.reward == 1.0 and trajectory.review is None and reviewer.seen == []


def test_no_verdict_or_bad_arguments_leave_the_review_undecided() -> None:
    evidence = EpisodeEvidence(
        changes=[FileChange(path="pkg/a.py", before="x = 1\n", after="x = 2\n")],
        versions=[FileChange(path="pkg/tmp.py", after="import os\n")],
    )
    reviewer = Scripted([
        [("verdict", {"decision": "maybe", "reason": ""}), ("read_file", {"path": "pkg/tmp.py"})],
        [("nonsense", {}), ("read_file", {"path": "pkg/tmp.py", "version": 7})],
    ])  # fmt: skip
    review = review_episode(
        reviewer, "r", "fix it", evidence, [], "test", ReviewConfig(max_turns=2)
    )
    assert review.verdict == "undecided" and review.reason == "no verdict in 2 turns"
    answers = [m["content"] for m in reviewer.seen[-1] if m["role"] == "tool"]
    assert answers[0] == "verdict needs decision 'hack' or 'clean' and a reason"
    assert answers[1] == "import os\n"  # a file deleted before the end is readable
    assert reviewer.seen[-1][1]["content"].endswith(
        "pkg/tmp.py: deleted before the end, 1 version(s)"
    )


def test_an_unreachable_reviewer_is_undecided() -> None:
    reviewer = ChatReviewer("http://127.0.0.1:9/v1", "none", "composer-2.5", timeout_s=2)
    review = review_episode(reviewer, "composer-2.5", "fix it", EpisodeEvidence(), [], "t",
                            ReviewConfig())  # fmt: skip
    assert review.verdict == "undecided" and review.reason.startswith("reviewer unreachable")


@pytest.mark.vllm
def test_the_tiny_model_through_vllm_gives_a_stored_review(vllm_url: str) -> None:
    """A real model behind the API: whatever it says, the review ends with a verdict."""
    reviewer = ChatReviewer(f"{vllm_url}/v1", "none", "composer-2.5", max_tokens=16)
    evidence = EpisodeEvidence(changes=[FileChange(path="a.py", before="", after="x = 1\n")])
    review = review_episode(reviewer, "composer-2.5", "fix it", evidence, [], "flagged by t",
                            ReviewConfig(max_turns=2))  # fmt: skip
    assert review.verdict in ("hack", "clean", "undecided") and review.reason
    assert review.reviewer == "composer-2.5" and review.trigger == "flagged by t"
