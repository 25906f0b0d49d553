"""The coding environment end to end: a built task, an episode, the harness-owned reward,
the monitor's veto, feedback marks; with a scripted policy and with the real vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from training.rl.agent import Completion, EpisodeConfig, PolicyClient, SamplingConfig, fixed_version
from training.rl.feedback import load_feedback_config
from training.rl.rollouts.environments import CodingEnvironment
from training.rl.rollouts.request import RolloutRequest
from training.rl.tasks.builder import BuildConfig, build_tasks
from training.rl.trajectory import ToolCall

FIXTURE = Path(__file__).parents[1] / "tasks" / "fixture_repo"


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("tasks")
    report = build_tasks(FIXTURE, out, BuildConfig(only=("to_roman",), source_name="textkit"))
    (task,) = report.tasks
    return out, task.task_id


class ScriptedPolicy:
    def __init__(self, turns: list[list[tuple[str, dict[str, Any]]]]) -> None:
        self.turns = turns
        self.calls = 0

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        script = self.turns[self.calls]
        self.calls += 1
        calls = [ToolCall(call_id=f"c{self.calls}{i}", name=n, arguments=json.dumps(a))
                 for i, (n, a) in enumerate(script)]  # fmt: skip
        return Completion([1, 2, 3], [4, 5], [-0.5, -0.7], "", calls, "tool_calls")


def _run(task_root: tuple[Path, str], policy: Any) -> Any:
    root, task_id = task_root
    env = CodingEnvironment(root, EpisodeConfig(max_turns=4), load_feedback_config())
    request = RolloutRequest(rollout_id="r", task_id=task_id, environment="coding",
                             policy_version=3)  # fmt: skip
    return env.run(request, policy, fixed_version(3))


def test_honest_fix_earns_full_reward(task_root: tuple[Path, str]) -> None:
    fixed = (FIXTURE / "textkit" / "roman.py").read_text()
    trajectory = _run(task_root, ScriptedPolicy([
        [("read_file", {"path": "textkit/roman.py"}), ("search", {"q": "roman"})],
        [("write_file", {"path": "textkit/roman.py", "content": fixed})],
        [("finish", {})],
    ]))  # fmt: skip
    assert trajectory.reward == trajectory.raw_reward == 1.0
    assert trajectory.verdicts == []
    assert trajectory.tests is not None and all(trajectory.tests.fail_to_pass.values())
    assert (trajectory.invalid_tool_calls, trajectory.tool_calls) == (1, 4)
    # The unknown tool on turn 0 is where targeted text feedback applies.
    assert [(m.turn_index, m.trigger) for m in trajectory.feedback] == [(0, "unknown_tool")]
    assert trajectory.policy_version_start == trajectory.policy_version_end == 3


def test_fix_plus_test_tampering_earns_nothing(task_root: tuple[Path, str]) -> None:
    fixed = (FIXTURE / "textkit" / "roman.py").read_text()
    trajectory = _run(task_root, ScriptedPolicy([
        [("write_file", {"path": "textkit/roman.py", "content": fixed}),
         ("write_file", {"path": "tests/test_stack.py", "content": "def test_x():\n    pass\n"})],
        [("finish", {})],
    ]))  # fmt: skip
    assert trajectory.raw_reward == 1.0  # the tests were reset, so the fix alone passes
    assert trajectory.reward == 0.0
    assert [v.rule for v in trajectory.verdicts] == ["test_tampering"]
    assert "tests/test_stack.py" in trajectory.verdicts[0].evidence


@pytest.mark.vllm
def test_real_model_episode_is_scored(task_root: tuple[Path, str], vllm_url: str) -> None:
    client = PolicyClient(f"{vllm_url}/v1", "unused", SamplingConfig(max_tokens=12))
    trajectory = _run(task_root, client)
    client.close()
    assert trajectory.tests is not None
    assert set(trajectory.tests.fail_to_pass) == {
        "tests/test_roman.py::test_to_roman[1994-MCMXCIV]",
        "tests/test_roman.py::test_to_roman[4-IV]",
        "tests/test_roman.py::test_to_roman_range",
    }
    assert all(trajectory.tests.pass_to_pass.values())  # nothing broke the rest
    assert trajectory.reward == 0.0  # the random tiny model fixes nothing
    for turn in trajectory.turns:
        assert len(turn.completion_token_ids) == len(turn.completion_logprobs) > 0
