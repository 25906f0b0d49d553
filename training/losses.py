"""Loss hooks: how a batch's logits become the number the trainer minimises.

A loss hook is any callable ``(logits, batch) -> LossTerms``. It sees this rank's part of
the batch only (its samples, and under context parallelism its chunk of each sequence)
and returns a *sum* over its tokens plus how many tokens that sum covers. The trainer
divides by the token count summed over all ranks, so the objective is the exact global
mean however tokens are split across ranks or masked.

Supervised fine-tuning uses :func:`cross_entropy_loss`. RL objectives (GRPO, a KL penalty
against a reference policy, ...) plug in the same way: any extra per-token tensors in the
batch (``advantages``, ``old_logprobs``, ``ref_logprobs``, ``loss_mask`` ...) with the same
``[batch, seq]`` leading shape as ``input_ids`` are split exactly like the tokens, and
:func:`token_logprobs` gives the policy's log-probability of each target token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100


@dataclass
class LossTerms:
    loss_sum: Tensor  # differentiable scalar: sum of per-token losses on this rank
    tokens: Tensor  # scalar: how many tokens loss_sum covers
    # Extra scalars to report, as sums over this rank's tokens (the trainer averages them).
    metrics: dict[str, Tensor] = field(default_factory=dict)


LossFn = Callable[[Tensor, Mapping[str, Tensor]], LossTerms]


def token_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """log p(label) per position ([batch, seq]); 0 where the label is ignored."""
    safe = labels.clamp(min=0)
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, safe.unsqueeze(-1))
    return logprobs.squeeze(-1) * (labels != IGNORE_INDEX)


def cross_entropy_loss(logits: Tensor, batch: Mapping[str, Tensor]) -> LossTerms:
    """Next-token cross entropy; ``labels`` are already shifted, -100 is ignored."""
    labels = batch["labels"]
    loss_sum = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return LossTerms(loss_sum=loss_sum, tokens=(labels != IGNORE_INDEX).sum())
