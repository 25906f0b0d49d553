"""GRPO and hint-KL losses on token-aligned tensors.

Shapes: ``[N, L]`` where row n is one model turn's completion (L tokens, right-padded)
and ``mask`` marks real model tokens. Prompt and tool-result tokens never reach these
functions, which is how the loss stays on model tokens only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from training.feedback import KlNormalisation
from training.rl.config import GRPOConfig


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one policy-loss evaluation (detached floats)."""

    #: Share of tokens whose ratio the correction capped (clipped, or truncated).
    capped_fraction: float
    mean_ratio: float
    #: KL(sampler || trainer) per token, estimated from the sampled tokens (k3).
    approx_kl: float
    tokens: int


def group_advantages(
    rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages for one group of rollouts of the same task.

    ``(r - mean(r)) / (std(r) + eps)`` with the sample standard deviation (Bessel), as in
    DeepSeekMath's GRPO. A group whose rewards are all equal carries no signal: zeros.
    """
    if rewards.ndim != 1 or rewards.numel() < 2:
        raise ValueError("a GRPO group needs a 1-D tensor of at least two rewards")
    centered = rewards - rewards.mean()
    if not scale_by_std:
        return centered
    return centered / (rewards.std(unbiased=True) + eps)


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


def clipped_surrogate(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``-min(r A, clip(r) A)`` and whether the clip was the minimum.

    ``advantages`` broadcasts against ``logprobs`` (per row [N, 1] or per token [N, L]).
    """
    ratio = torch.exp(logprobs - sampling_logprobs)
    adv = advantages.to(logprobs.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def truncated_is_surrogate(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    cap: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``-w A`` whose gradient is ``-w A grad(log p)``, with the importance
    weight ``w = min(p_trainer / p_sampler, cap)`` held constant, and where ``w`` was
    truncated.

    The engine samples with its own kernels and precision (and, asynchronously, weights
    up to ``max_staleness`` versions old), so its token probabilities differ from the
    trainer's: the policy gradient of the trainer's policy weights each token by their
    ratio, truncated so one token cannot dominate (truncated importance sampling). With
    one optimizer step per batch the trainer's policy is the proximal one, so no PPO clip
    is needed on top.
    """
    log_weight = logprobs.detach() - sampling_logprobs
    weight = log_weight.exp().clamp(max=cap)
    adv = advantages.to(logprobs.dtype)
    per_token = -weight * torch.exp(logprobs - logprobs.detach()) * adv
    return per_token, log_weight > math.log(cap)


def policy_surrogate(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    config: GRPOConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token policy loss of ``config.correction`` and which tokens it capped."""
    if config.correction == "tis":
        return truncated_is_surrogate(logprobs, sampling_logprobs, advantages, config.tis_cap)
    return clipped_surrogate(
        logprobs, sampling_logprobs, advantages, config.clip_low, config.clip_high
    )


def mismatch_kl(logprobs: torch.Tensor, sampling_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(sampler || trainer), estimated on the sampled tokens (k3: unbiased,
    never negative): ``(r - 1) - log r`` with ``r = p_trainer / p_sampler``."""
    log_ratio = logprobs.detach() - sampling_logprobs
    return log_ratio.exp() - 1 - log_ratio


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


def kl_per_token(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(student || teacher) at each position, over the full vocabulary."""
    student_logp = torch.log_softmax(student_logits.float(), dim=-1)
    return (student_logp.exp() * (student_logp - teacher_logprobs.detach())).sum(dim=-1)


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
