"""Targeted text feedback: triggers from YAML, hint insertion, and what the hint KL does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from rl_toy import VOCAB, BagOfContextLM, encode

from training.rl.feedback import (
    FeedbackConfigError,
    TextFeedbackConfig,
    Trigger,
    detect_feedback,
    hinted_prompt,
    load_feedback_config,
)
from training.rl.learner.batch import build_batch
from training.rl.learner.config import GRPOConfig
from training.rl.learner.grpo_reference import rl_loss
from training.rl.trajectory import FeedbackMark, ToolCall, ToolResult, Trajectory, Turn

TOOLS = ["read_file", "finish"]
FEEDBACK = TextFeedbackConfig(
    kl_coef=1.0,
    hint_template="SYS {hint} END",
    generation_prompt="ASSIST",
    triggers=(Trigger(name="unknown_tool", unknown_tool=True, hint="tools"),),
)


def _turn(index: int, prompt: str, completion: str, call: str | None, reply: str = "ok") -> Turn:
    ids = encode(completion)
    calls = [ToolCall(call_id=f"c{index}", name=call, arguments="{}")] if call else []
    results = (
        [ToolResult(call_id=f"c{index}", name=call, content=reply, ok=reply == "ok")]
        if call
        else []
    )
    return Turn(
        index=index,
        policy_version=0,
        prompt_token_ids=encode(prompt),
        completion_token_ids=ids,
        completion_logprobs=[-1.0] * len(ids),
        completion_text=completion,
        tool_calls=calls,
        tool_results=results,
    )


def _trajectory(name: str, reward: float) -> Trajectory:
    turns = [
        _turn(0, "USER hello ASSIST", "search", "search", "notfound"),
        _turn(1, "USER hello ASSIST search notfound ASSIST", "read_file", "read_file"),
        _turn(
            2, "USER hello ASSIST search notfound ASSIST read_file ok ASSIST", "finish", "finish"
        ),
    ]
    return Trajectory(
        trajectory_id=name,
        rollout_id=name,
        task_id="t",
        environment="toy",
        policy_version_start=0,
        policy_version_end=0,
        turns=turns,
        reward=reward,
        raw_reward=reward,
        feedback=detect_feedback(turns, TOOLS, FEEDBACK),
    )


def test_default_yaml_loads_and_flags_unknown_tool() -> None:
    config = load_feedback_config()
    assert {t.name for t in config.triggers} >= {"unknown_tool", "tool_not_found_reply"}
    marks = detect_feedback(_trajectory("a", 1.0).turns, TOOLS, config)
    assert [(m.turn_index, m.trigger) for m in marks] == [(0, "unknown_tool")]
    assert "read_file, finish" in marks[0].hint


def test_tool_result_trigger_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "fb.yaml"
    path.write_text(
        "kl_coef: 0.5\nkl_normalisation: turn\ntriggers:\n"
        "  - {name: nf, tool_result_regex: '^notfound', hint: 'use {tools}'}\n"
    )
    config = load_feedback_config(path)
    assert config.kl_coef == 0.5 and config.kl_normalisation == "turn"
    marks = detect_feedback(_trajectory("a", 1.0).turns, TOOLS, config)
    assert [(m.turn_index, m.hint) for m in marks] == [(0, "use read_file, finish")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("triggers:\n  - {name: x}\n", "needs at least 'name' and 'hint'"),
        ("triggers:\n  - {name: x, hint: h}\n", "has no condition"),
        ("triggers:\n  - {name: x, hint: h, completion_regex: '('}\n", "bad regex"),
        ("triggers:\n  - {name: x, hint: h, min_completion_tokens: 0}\n", "positive integer"),
        ("triggers:\n  - {name: x, hint: h, min_completion_tokens: lots}\n", "positive int"),
        ("triggers:\n  - {name: x, hint: h, min_completion_tokens: true}\n", "positive int"),
        ("kl_coeff: 1\n", "unknown keys"),
        ("kl_normalisation: batch\n", "kl_normalisation"),
    ],
)
def test_bad_feedback_yaml_is_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "fb.yaml"
    path.write_text(text)
    with pytest.raises(FeedbackConfigError, match=message):
        load_feedback_config(path)


def test_cstack_rl_names_a_bad_feedback_config_before_starting(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from deploy.cli import app

    path = tmp_path / "fb.yaml"
    path.write_text("kl_coeff: 1\n")
    result = CliRunner().invoke(app, ["rl", "--feedback-config", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2
    # Typer draws the message in a box wrapped to the terminal: compare it unwrapped.
    output = re.sub(r"[\s│]+", " ", result.output)
    assert "--feedback-config" in output and "unknown keys ['kl_coeff']" in output
    assert not (tmp_path / "steps.jsonl").exists()


def test_hint_goes_before_the_assistant_header() -> None:
    ids = hinted_prompt(encode("USER hello ASSIST"), "tools", FEEDBACK, encode)
    assert ids == encode("USER hello SYS tools END ASSIST")
    no_header = hinted_prompt(encode("USER hello"), "tools", FEEDBACK, encode)
    assert no_header == encode("USER hello SYS tools END")


class _RecordingPolicy:
    """Keeps the student's logits (the forward that builds the graph) to read their grad."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.student_logits: torch.Tensor | None = None

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(ids)
        if torch.is_grad_enabled():
            logits.retain_grad()
            self.student_logits = logits
        return logits


def _logit_grads(feedback: TextFeedbackConfig) -> torch.Tensor:
    model = BagOfContextLM(seed=1)
    policy = _RecordingPolicy(model)
    config = GRPOConfig(feedback=feedback)
    batch = build_batch([[_trajectory("a", 1.0), _trajectory("b", 0.0)]], config, encode)
    loss, _ = rl_loss(policy, batch, config)
    loss.backward()
    assert policy.student_logits is not None and policy.student_logits.grad is not None
    return policy.student_logits.grad


def test_hint_kl_touches_only_the_flagged_turn() -> None:
    with_kl = _logit_grads(FEEDBACK)
    without = _logit_grads(TextFeedbackConfig(enabled=False))
    # rows: trajectory a turns 0,1,2 then trajectory b turns 0,1,2; turn 0 is flagged
    flagged, others = [0, 3], [1, 2, 4, 5]
    assert torch.equal(with_kl[others], without[others])
    assert not torch.allclose(with_kl[flagged], without[flagged])


def test_hint_kl_lowers_the_invalid_tool_probability() -> None:
    model = BagOfContextLM(seed=0)
    with torch.no_grad():
        # The hint token pushes the invalid tool down: the teacher knows better.
        model.table[VOCAB["tools"], VOCAB["search"]] = -30.0
    # Equal rewards: zero advantages, so only the hint KL moves the policy.
    config = GRPOConfig(feedback=FEEDBACK)
    batch = build_batch([[_trajectory("a", 1.0), _trajectory("b", 1.0)]], config, encode)
    context = torch.tensor([encode("USER hello ASSIST")])

    def p_invalid() -> float:
        with torch.no_grad():
            return float(torch.softmax(model(context)[0, -1], -1)[VOCAB["search"]])

    before = p_invalid()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    kls = []
    for _ in range(20):
        optimizer.zero_grad()
        loss, stats = rl_loss(model, batch, config)
        loss.backward()
        optimizer.step()
        kls.append(stats.hint_kl)
    after = p_invalid()
    assert stats.flagged_turns == 2 and stats.policy_loss == 0.0
    assert after < 0.5 * before
    assert kls[-1] < kls[0]


STYLE = TextFeedbackConfig(
    kl_coef=1.0,
    hint_template="SYS {hint} END",
    generation_prompt="ASSIST",
    triggers=(
        Trigger(name="unknown_tool", unknown_tool=True, hint="tools"),
        Trigger(name="long_answer", min_completion_tokens=4, hint="ok"),
    ),
)


def _answer(length: int) -> Turn:
    """A tool-less answer of ``length`` tokens."""
    return _turn(0, "USER hello ASSIST", " ".join(["hello"] * length), None)


def test_default_yaml_flags_a_long_answer_and_not_a_short_one() -> None:
    config = load_feedback_config()
    (long_answer,) = (t for t in config.triggers if t.name == "long_answer")
    limit = long_answer.min_completion_tokens
    assert limit is not None
    marks = detect_feedback([_answer(limit)], TOOLS, config)
    assert [(m.turn_index, m.trigger) for m in marks] == [(0, "long_answer")]
    assert marks[0].hint.startswith("Be concise")
    assert detect_feedback([_answer(limit - 1)], TOOLS, config) == []


def test_a_tool_mistake_wins_over_the_style_trigger_on_the_same_turn() -> None:
    turn = _turn(0, "USER hello ASSIST", "search search search search", "search")
    marks = detect_feedback([turn], TOOLS, STYLE)
    assert [m.trigger for m in marks] == ["unknown_tool"]


def test_style_trigger_from_yaml_combines_with_a_regex(tmp_path: Path) -> None:
    path = tmp_path / "fb.yaml"
    path.write_text(
        "triggers:\n"
        "  - {name: long_hello, min_completion_tokens: 3, completion_regex: hello,"
        " hint: 'be brief'}\n"
    )
    config = load_feedback_config(path)
    assert [m.trigger for m in detect_feedback([_answer(3)], TOOLS, config)] == ["long_hello"]
    assert detect_feedback([_answer(2)], TOOLS, config) == []
    finish = _turn(0, "USER hello ASSIST", "finish finish finish", None)
    assert detect_feedback([finish], TOOLS, config) == []


def _style_trajectory(name: str, length: int) -> Trajectory:
    turns = [_answer(length)]
    return Trajectory(
        trajectory_id=name, rollout_id=name, task_id="t", environment="toy",
        policy_version_start=0, policy_version_end=0, turns=turns, reward=1.0,
        raw_reward=1.0, feedback=detect_feedback(turns, TOOLS, STYLE),
    )  # fmt: skip


def test_style_hint_builds_the_teacher_context_and_a_kl_term() -> None:
    config = GRPOConfig(feedback=STYLE)
    group = [_style_trajectory("long", 5), _style_trajectory("short", 2)]
    assert [[m.trigger for m in t.feedback] for t in group] == [["long_answer"], []]
    batch = build_batch([group], config, encode)
    assert batch.flagged_rows.tolist() == [0]
    hinted = [i for i in batch.hinted_input_ids[0].tolist() if i != VOCAB["<pad>"]]
    assert hinted == encode("USER hello SYS ok END ASSIST") + encode(" ".join(["hello"] * 5))
    # Equal rewards: zero advantages, so the loss is the style hint's KL alone.
    loss, stats = rl_loss(BagOfContextLM(seed=1), batch, config)
    assert stats.flagged_turns == 1 and stats.policy_loss == 0.0
    assert stats.hint_kl > 0.0 and float(loss.detach()) > 0.0
    off = GRPOConfig(feedback=TextFeedbackConfig(enabled=False))
    loss_off, _ = rl_loss(BagOfContextLM(seed=1), build_batch([group], off, encode), off)
    assert float(loss_off.detach()) == 0.0


def test_feedback_marks_survive_the_record_round_trip() -> None:
    trajectory = _trajectory("a", 1.0)
    again = Trajectory.model_validate_json(trajectory.model_dump_json())
    assert again.feedback == [FeedbackMark(turn_index=0, trigger="unknown_tool", hint="tools")]


@pytest.mark.vllm
def test_hinted_prompt_equals_vllms_rendering_with_the_hint_message(
    vllm_url: str, tiny_model: Path
) -> None:
    import httpx
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))

    def real_encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    def render(messages: list[dict[str, str]]) -> list[int]:
        body = {"model": "composer-2.5", "messages": messages, "add_generation_prompt": True}
        return list(httpx.post(f"{vllm_url}/tokenize", json=body, timeout=60).json()["tokens"])

    hint = "Reminder: available tools: read_file, finish."
    chat = [{"role": "user", "content": "Fix the bug."}]
    hinted = hinted_prompt(render(chat), hint, load_feedback_config(), real_encode)
    assert hinted == render([*chat, {"role": "system", "content": hint}])
