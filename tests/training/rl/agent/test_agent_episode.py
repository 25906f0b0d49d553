"""Episodes: the loop with a scripted policy, and exact token ids from the real vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from training.rl.agent import (
    Completion,
    EpisodeConfig,
    PolicyClient,
    SamplingConfig,
    fixed_version,
    run_episode,
)
from training.rl.trajectory import TestOutcome, ToolCall

FIXTURE = Path(__file__).parents[1] / "tasks" / "fixture_repo"


class ScriptedPolicy:
    """Replays fixed tool calls (the tiny random model cannot); records what it was sent."""

    def __init__(self, script: list[list[tuple[str, dict[str, Any]]]]) -> None:
        self.script = script
        self.seen: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        turn = len(self.seen)
        self.seen.append([dict(m) for m in messages])
        calls = [
            ToolCall(call_id=f"call{turn}_{i}", name=name, arguments=json.dumps(args))
            for i, (name, args) in enumerate(self.script[turn])
        ]
        return Completion([1, 2, turn], [7, 8], [-0.1, -0.2], "", calls, "tool_calls")


def test_scripted_episode_records_commands_diff_and_results() -> None:
    fixed = (FIXTURE / "textkit" / "roman.py").read_text()
    policy = ScriptedPolicy([
        [("list_dir", {"path": "textkit"}), ("grep", {"q": "roman"})],
        [("write_file", {"path": "textkit/roman.py", "content": fixed + "\n# done\n"})],
        [("finish", {})],
        [("finish", {})],
    ])  # fmt: skip
    scored: list[Path] = []

    def evaluate(root: Path) -> TestOutcome:
        scored.append(root)
        assert (root / "textkit" / "roman.py").read_text().endswith("# done\n")
        return TestOutcome(fail_to_pass={"t": True})

    result = run_episode(policy, fixed_version(7), FIXTURE, "Fix it.", EpisodeConfig(),
                         evaluate=evaluate)  # fmt: skip
    assert result.ended_by == "finish" and len(result.turns) == 3
    assert [t.policy_version for t in result.turns] == [7, 7, 7]
    assert (result.tool_calls, result.invalid_tool_calls) == (4, 1)
    assert result.turns[0].tool_results[1].content.startswith("Tool not found")
    assert [c.tool for c in result.commands] == ["list_dir", "grep", "write_file", "finish"]
    (change,) = result.changes
    assert change.path == "textkit/roman.py" and change.after == fixed + "\n# done\n"
    assert result.tests == TestOutcome(fail_to_pass={"t": True})
    # The tool results went back to the model as tool messages, in order.
    tool_messages = [m for m in policy.seen[1] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call0_0", "call0_1"]
    assert not scored[0].exists()  # the sandbox is thrown away


def test_wall_time_limit_ends_the_episode() -> None:
    policy = ScriptedPolicy([[("list_dir", {"path": "."})]] * 3)
    config = EpisodeConfig(max_turns=3, wall_time_s=0.0)
    result = run_episode(policy, fixed_version(0), FIXTURE, "x", config)
    assert result.ended_by == "wall_time" and len(result.turns) <= 1


@pytest.mark.vllm
def test_real_vllm_turns_carry_exact_token_ids(vllm_url: str) -> None:
    client = PolicyClient(f"{vllm_url}/v1", "unused", SamplingConfig(max_tokens=16))
    result = run_episode(client, fixed_version(0), FIXTURE, "Implement to_roman.",
                         EpisodeConfig(max_turns=2))  # fmt: skip
    client.close()
    first, second = result.turns
    for turn in result.turns:
        assert 0 < len(turn.completion_token_ids) == len(turn.completion_logprobs) <= 16
        assert all(lp <= 0.0 for lp in turn.completion_logprobs)
    # The prompt ids are vLLM's rendering of the chat: /tokenize gives the same ids.
    system = EpisodeConfig().system_prompt
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "Implement to_roman."}]  # fmt: skip
    from training.rl.agent import TOOL_SPECS

    tokenized = httpx.post(
        f"{vllm_url}/tokenize",
        json={"model": "composer-2.5", "messages": messages, "tools": TOOL_SPECS,
              "add_generation_prompt": True},
        timeout=60,
    ).json()  # fmt: skip
    assert first.prompt_token_ids == tokenized["tokens"]

    # The second prompt extends the first: the model's turn is replayed, not re-sampled.
    # In text exactly; in token ids up to the first prompt's last token, which byte-level
    # BPE may merge with the start of the replayed turn (seen: the generation prompt's
    # "\n" and a reply starting with two spaces, one token "\n  ").
    def text(ids: list[int]) -> str:
        detokenized = httpx.post(
            f"{vllm_url}/detokenize", json={"model": "composer-2.5", "tokens": ids}, timeout=60
        )
        return str(detokenized.json()["prompt"])

    assert text(second.prompt_token_ids).startswith(text(first.prompt_token_ids))
    boundary = len(first.prompt_token_ids) - 1
    assert second.prompt_token_ids[:boundary] == first.prompt_token_ids[:boundary]
