"""The RL loss as one expression, the test oracle: GRPO on every model turn plus hint KL
on flagged turns.

The trainer never runs this: it runs ``training.rl.learner.trainer_hook``, built from the
same pieces (``training.rl.learner.losses``) and spread over the trainer's batches and
ranks. Tests hold the hook equal to this reference. The policy is any callable from token
ids [B, T] to logits [B, T, V], so a transformers model or a toy model plugs in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from training.components.losses import token_logprobs
from training.rl.feedback import KlNormalisation
from training.rl.learner.batch import TurnBatch, completion_logits
from training.rl.learner.config import GRPOConfig
from training.rl.learner.losses import kl_per_token, mismatch_kl, policy_surrogate

Policy = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one policy-loss evaluation (detached floats)."""

    #: Share of tokens whose ratio the correction capped (clipped, or truncated).
    capped_fraction: float
    mean_ratio: float
    #: KL(sampler || trainer) per token, estimated from the sampled tokens (k3).
    approx_kl: float
    tokens: int


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, normalisation: str) -> torch.Tensor:
    maskf = mask.to(per_token.dtype)
    if normalisation == "token":
        return (per_token * maskf).sum() / maskf.sum().clamp(min=1.0)
    if normalisation in ("sequence", "turn"):
        lengths = maskf.sum(dim=-1)
        rows = lengths > 0
        per_row = (per_token * maskf).sum(dim=-1)
        if normalisation == "sequence":
            per_row = per_row / lengths.clamp(min=1.0)
        return per_row[rows].sum() / rows.sum().clamp(min=1)
    raise ValueError(f"unknown normalisation {normalisation!r}")


def policy_loss(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOConfig,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """The policy-gradient loss against the logprobs vLLM sampled with.

    ``advantages`` is per row [N] (every token of a turn shares its trajectory's
    advantage). ``config.normalisation='token'`` averages over all model tokens of the
    batch; ``'sequence'`` averages within each turn first, then over turns.
    """
    per_token, capped = policy_surrogate(
        logprobs, sampling_logprobs, advantages.unsqueeze(-1), config
    )
    loss = _reduce(per_token, mask, config.normalisation)
    with torch.no_grad():
        maskb = mask.bool()
        count = int(maskb.sum())
        log_ratio = (logprobs - sampling_logprobs)[maskb]
        stats = PolicyLossStats(
            capped_fraction=float((capped & maskb).sum()) / max(count, 1),
            mean_ratio=float(log_ratio.exp().mean()) if count else 1.0,
            approx_kl=float(mismatch_kl(logprobs, sampling_logprobs)[maskb].mean())
            if count
            else 0.0,
            tokens=count,
        )
    return loss, stats


def hint_kl_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    normalisation: KlNormalisation = "token",
) -> torch.Tensor:
    """Per-token KL(student || teacher) over the full vocabulary, on flagged turns only.

    The student is the policy on the turn's real (un-hinted) context; the teacher is the
    same policy on the hinted context, computed without gradient. Minimising the reverse
    KL moves the student's mass to where the hinted policy puts it, token by token.
    ``normalisation='token'``: mean over flagged tokens; ``'turn'``: per-turn sums,
    averaged over flagged turns.
    """
    teacher_logp = torch.log_softmax(teacher_logits.detach().float(), dim=-1)
    return _reduce(kl_per_token(student_logits, teacher_logp), mask, normalisation)


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
