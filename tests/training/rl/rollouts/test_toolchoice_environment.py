"""The toolchoice environment: scoring, the invalid-call record and the hint marks, with a
scripted policy and with the real vLLM (a tool-less turn must be accepted by it)."""

from __future__ import annotations

from typing import Any

import pytest

from training.rl.agent import Completion, PolicyClient, SamplingConfig, fixed_version
from training.rl.feedback import load_feedback_config
from training.rl.rollouts.environments import (
    TOOLCHOICE_TOOLS,
    ToolChoiceEnvironment,
    toolchoice_available,
    toolchoice_hint,
)
from training.rl.rollouts.request import RolloutRequest


class OneReply:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tools: list[dict[str, Any]] | None = None

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        self.tools = tools
        return Completion([1, 2], [7, 3], [-0.5, -0.1], self.text, [], "stop")


def _run(text: str, task: str = "tools-1") -> Any:
    env = ToolChoiceEnvironment(load_feedback_config())
    request = RolloutRequest(rollout_id="r", task_id=task, environment="toolchoice",
                             policy_version=4)  # fmt: skip
    return env.run(request, OneReply(text), fixed_version(4))


def test_tasks_offer_four_tools_and_neighbours_overlap() -> None:
    sets = [set(toolchoice_available(f"tools-{k}")) for k in range(4)]
    assert all(len(s) == 4 and s <= set(TOOLCHOICE_TOOLS) for s in sets)
    assert len(sets[0] & sets[1]) == 2 and not sets[0] & sets[2]
    with pytest.raises(ValueError, match="tools-0"):
        toolchoice_available("digits-0")


def test_valid_invalid_and_no_call() -> None:
    available = toolchoice_available("tools-1")
    valid = _run(f" {available[0]}")
    assert (valid.reward, valid.tool_calls, valid.invalid_tool_calls) == (1.0, 1, 0)
    assert valid.feedback == [] and valid.turns[0].policy_version == 4
    wrong = next(t for t in TOOLCHOICE_TOOLS if t not in available)
    invalid = _run(wrong)
    assert (invalid.reward, invalid.tool_calls, invalid.invalid_tool_calls) == (0.0, 1, 1)
    assert invalid.turns[0].tool_results[0].content.startswith("Tool not found")
    (mark,) = invalid.feedback
    # The hint lists this task's tools, exactly as the warm-up (bench) renders it.
    assert mark.trigger == "unknown_tool"
    assert mark.hint == toolchoice_hint(available, load_feedback_config())
    none = _run("hello")
    assert (none.reward, none.tool_calls, none.invalid_tool_calls) == (0.0, 0, 0)


@pytest.mark.vllm
def test_a_real_turn_without_tools(vllm_url: str) -> None:
    env = ToolChoiceEnvironment(load_feedback_config())
    policy = PolicyClient(f"{vllm_url}/v1", "none", SamplingConfig(max_tokens=4))
    request = RolloutRequest(rollout_id="r", task_id="tools-0", environment="toolchoice",
                             policy_version=0)  # fmt: skip
    trajectory = env.run(request, policy, fixed_version(0))
    (turn,) = trajectory.turns
    assert turn.prompt_token_ids and len(turn.completion_logprobs) == len(turn.completion_token_ids)
    assert trajectory.reward in (0.0, 1.0)


@pytest.mark.vllm
def test_a_seeded_rollout_repeats_its_sample(vllm_url: str) -> None:
    """Same request seed, same weights: the same tokens (so two runs share random numbers)."""
    env = ToolChoiceEnvironment(load_feedback_config())
    policy = PolicyClient(f"{vllm_url}/v1", "none", SamplingConfig(max_tokens=6))

    def sample(seed: int) -> list[int]:
        request = RolloutRequest(rollout_id="r", task_id="tools-2", environment="toolchoice",
                                 policy_version=0, seed=seed)  # fmt: skip
        trajectory = env.run(request, policy.seeded(request.seed), fixed_version(0))
        return trajectory.turns[0].completion_token_ids

    first = sample(11)
    assert sample(11) == first
    assert any(sample(seed) != first for seed in (12, 13, 14))
