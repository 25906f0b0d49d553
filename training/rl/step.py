"""One RL loss evaluation: GRPO on every model turn plus hint KL on flagged turns.

The policy is any callable from token ids [B, T] to logits [B, T, V], so the trainer's
DeepSeek-V3 model, a transformers model or a toy model in tests all plug in the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from training.losses import token_logprobs
from training.rl.batch import TurnBatch, completion_logits
from training.rl.config import GRPOConfig
from training.rl.losses import hint_kl_loss, policy_loss

Policy = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RlLossStats:
    """What one step reports to the display and metrics."""

    policy_loss: float
    hint_kl: float
    loss: float
    capped_fraction: float
    approx_kl: float
    tokens: int
    flagged_turns: int
    mean_reward: float


def rl_loss(
    policy: Policy, batch: TurnBatch, config: GRPOConfig
) -> tuple[torch.Tensor, RlLossStats]:
    """The differentiable loss and its stats. The teacher forward runs under no_grad."""
    length = batch.completion_ids.shape[1]
    student = completion_logits(policy(batch.input_ids), batch.completion_start, length)
    logprobs = token_logprobs(student, batch.completion_ids)
    pg_loss, stats = policy_loss(
        logprobs, batch.sampling_logprobs, batch.advantages, batch.completion_mask, config
    )
    loss = pg_loss
    kl_value = 0.0
    flagged = int(batch.flagged_rows.numel())
    if flagged and config.feedback.enabled and config.feedback.kl_coef > 0:
        with torch.no_grad():
            teacher = completion_logits(policy(batch.hinted_input_ids), batch.hinted_start, length)
        kl = hint_kl_loss(
            student[batch.flagged_rows],
            teacher,
            batch.completion_mask[batch.flagged_rows],
            config.feedback.kl_normalisation,
        )
        loss = loss + config.feedback.kl_coef * kl
        kl_value = float(kl.detach())
    return loss, RlLossStats(
        policy_loss=float(pg_loss.detach()),
        hint_kl=kl_value,
        loss=float(loss.detach()),
        capped_fraction=stats.capped_fraction,
        approx_kl=stats.approx_kl,
        tokens=stats.tokens,
        flagged_turns=flagged,
        mean_reward=float(batch.rewards.mean()) if batch.rewards.numel() else 0.0,
    )
