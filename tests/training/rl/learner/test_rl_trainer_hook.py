"""The GRPO + hint-KL hook inside the real trainer core equals the plain reference loss."""

from __future__ import annotations

import pytest
import torch
from rl_toy import encode

from training.components.losses import token_logprobs
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.model import DeepseekV3Model
from training.optim.config import MuonConfig
from training.rl.feedback import TextFeedbackConfig, Trigger, detect_feedback
from training.rl.learner.batch import build_batch, completion_logits
from training.rl.learner.config import GRPOConfig
from training.rl.learner.grpo_reference import rl_loss
from training.rl.learner.trainer_hook import grpo_loss_hook, trainer_batch
from training.rl.trajectory import Trajectory, Turn
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer

SMALL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2, q_lora_rank=16,
    kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
    max_position_embeddings=64,
)  # fmt: skip
FEEDBACK = TextFeedbackConfig(
    kl_coef=0.5, hint_template="SYS {hint} END", generation_prompt="ASSIST",
    triggers=(Trigger(name="unknown_tool", unknown_tool=True, hint="tools"),),
)  # fmt: skip


def _trajectory(name: str, reward: float, completion: list[int]) -> Trajectory:
    from training.rl.trajectory import ToolCall, ToolResult

    bad = Turn(
        index=0,
        policy_version=0,
        prompt_token_ids=encode("USER hello ASSIST"),
        completion_token_ids=completion,
        completion_logprobs=[-2.0] * len(completion),
        tool_calls=[ToolCall(call_id="a", name="search", arguments="{}")],
        tool_results=[ToolResult(call_id="a", name="search", content="x", ok=False)],
    )
    good = Turn(index=1, policy_version=0,
                prompt_token_ids=encode("USER hello ASSIST search notfound ASSIST"),
                completion_token_ids=[6, 8], completion_logprobs=[-1.5, -3.0])  # fmt: skip
    turns = [bad, good]
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
        feedback=detect_feedback(turns, ["read_file"], FEEDBACK),
    )


@pytest.mark.parametrize(
    ("normalisation", "kl_normalisation", "correction"),
    [("token", "token", "tis"), ("sequence", "turn", "tis"), ("token", "token", "clip")],
)
def test_hook_in_trainer_equals_reference(
    process_group: None, normalisation: str, kl_normalisation: str, correction: str
) -> None:
    feedback = TextFeedbackConfig(**{**FEEDBACK.__dict__, "kl_normalisation": kl_normalisation})
    config = GRPOConfig(normalisation=normalisation, feedback=feedback,  # type: ignore[arg-type]
                        correction=correction)  # type: ignore[arg-type]  # fmt: skip
    groups = [[_trajectory("a", 1.0, [7, 9, 10]), _trajectory("b", 0.0, [7])]]
    batch = build_batch(groups, config, encode)

    reference = DeepseekV3Model(SMALL)
    reference.init_weights(5)
    expected, stats = rl_loss(lambda ids: reference(ids), batch, config)
    expected.backward()

    trainer = Trainer(
        TrainerConfig(model=SMALL, seed=5, batch_size=4, seq_len=16, grad_clip=1e9,
                      optimizer=MuonConfig(lr=0.01)),
        loss_fn=grpo_loss_hook(config),
    )  # fmt: skip
    inputs = trainer_batch(batch, config, teacher=lambda ids: trainer.model(ids))
    assert "teacher_logprobs" in inputs
    loss, tokens = trainer.forward_backward(inputs)
    assert tokens == int(batch.completion_mask.sum())
    assert loss == pytest.approx(float(expected.detach()), rel=1e-5, abs=1e-7)
    # The hook's metrics reach the trainer's step stats, summed over tokens.
    assert trainer.loss_metrics["mismatch_kl"] == pytest.approx(stats.approx_kl * tokens, rel=1e-4)
    # A token whose ratio sits at the cap may fall either side in the two computations.
    capped = stats.capped_fraction * tokens
    assert abs(trainer.loss_metrics["capped_tokens"] - capped) <= 1
    assert stats.approx_kl > 0  # the random model is far from the logprobs "sampled"
    # The teacher's margin on the flagged tokens, by hand on the reference model.
    with torch.no_grad():
        length = batch.completion_ids.shape[1]
        rows = batch.flagged_rows
        ids = batch.completion_ids[rows]
        student = completion_logits(reference(batch.input_ids), batch.completion_start, length)
        hinted = completion_logits(reference(batch.hinted_input_ids), batch.hinted_start, length)
        margin = token_logprobs(student[rows], ids) - token_logprobs(hinted, ids)
        flagged_mask = batch.completion_mask[rows]
    assert trainer.loss_metrics["flagged_tokens"] == int(flagged_mask.sum())
    assert trainer.loss_metrics["hint_margin"] == pytest.approx(
        float((margin * flagged_mask).sum()), rel=1e-4, abs=1e-5
    )
    for (name, param), (_, ref) in zip(
        trainer.model.named_parameters(), reference.named_parameters(), strict=True
    ):
        if ref.grad is None:
            continue
        grad = param.grad
        full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        torch.testing.assert_close(full, ref.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_style_hint_reaches_the_trainers_kl_term(process_group: None) -> None:
    """A long answer (no tool call) gets the style hint; with equal rewards only the hint
    KL is left, so the real trainer's loss is that KL term and nothing else."""
    style = TextFeedbackConfig(
        kl_coef=0.5, hint_template="SYS {hint} END", generation_prompt="ASSIST",
        triggers=(Trigger(name="long_answer", min_completion_tokens=3, hint="tools"),),
    )  # fmt: skip

    def answer(name: str, completion: list[int]) -> Trajectory:
        turn = Turn(index=0, policy_version=0, prompt_token_ids=encode("USER hello ASSIST"),
                    completion_token_ids=completion,
                    completion_logprobs=[-2.0] * len(completion))  # fmt: skip
        return Trajectory(
            trajectory_id=name, rollout_id=name, task_id="t", environment="toy",
            policy_version_start=0, policy_version_end=0, turns=[turn], reward=1.0,
            raw_reward=1.0, feedback=detect_feedback([turn], ["read_file"], style),
        )  # fmt: skip

    groups = [[answer("long", [7, 9, 10, 11]), answer("short", [7, 9])]]
    assert [m.trigger for t in groups[0] for m in t.feedback] == ["long_answer"]
    losses = []
    for feedback in (style, TextFeedbackConfig(enabled=False)):
        config = GRPOConfig(feedback=feedback)
        batch = build_batch(groups, config, encode)
        trainer = Trainer(
            TrainerConfig(model=SMALL, seed=5, batch_size=4, seq_len=16, grad_clip=1e9,
                          optimizer=MuonConfig(lr=0.01)),
            loss_fn=grpo_loss_hook(config),
        )  # fmt: skip
        inputs = trainer_batch(batch, config, teacher=trainer.model)
        loss, _ = trainer.forward_backward(inputs)
        losses.append(loss)
    with_hint, without = losses
    assert without == 0.0  # equal rewards: zero advantages, no policy loss
    assert with_hint > 0.0  # the style hint's KL, and only it
