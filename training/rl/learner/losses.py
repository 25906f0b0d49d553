"""The pieces of the RL loss the trainer runs: GRPO advantages, the policy surrogate (PPO
clip or truncated importance sampling), the sampler-trainer mismatch, the hint KL.

``training.rl.learner.trainer_hook`` puts them together in the trainer's loss function;
``training.rl.learner.grpo_reference`` is the same loss written as one expression, the
test oracle. Shapes: ``[N, L]`` where row n is one model turn's completion (L tokens,
right-padded) and ``mask`` marks real model tokens.
"""

from __future__ import annotations

import math

import torch

from training.rl.learner.config import GRPOConfig


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


def kl_per_token(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(student || teacher) at each position, over the full vocabulary."""
    student_logp = torch.log_softmax(student_logits.float(), dim=-1)
    return (student_logp.exp() * (student_logp - teacher_logprobs.detach())).sum(dim=-1)
