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

DeepSeek-V3's multi-token-prediction loss is the trainer's, added to any hook's:
:func:`mtp_inputs` lays out what each MTP depth reads and predicts on the global batch
(before it is split, so a context-parallel chunk's last positions see the next chunk's
tokens) and :func:`mtp_cross_entropy` scores each depth.
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
    # Extra scalars to report, as sums over this rank's tokens: the trainer sums them over
    # ranks into StepStats.loss_metrics. Every rank's hook must report the same names.
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


def mtp_inputs(input_ids: Tensor, labels: Tensor, depths: int) -> dict[str, Tensor]:
    """What MTP depth k (1..``depths``) reads and predicts at position i: token i+k
    (``mtp_input_ids``) and token i+k+1 (``mtp_labels``, the shifted ``labels`` moved k
    further, so -100 wherever the main loss ignores that token), stacked on a last
    dimension [batch, seq, depths]. Positions past the end read token 0 and predict -100."""
    ids, targets = [], []
    for k in range(1, depths + 1):
        ids.append(F.pad(input_ids[:, k:], (0, k), value=0))
        targets.append(F.pad(labels[:, k:], (0, k), value=IGNORE_INDEX))
    return {"mtp_input_ids": torch.stack(ids, dim=-1), "mtp_labels": torch.stack(targets, dim=-1)}


def mtp_cross_entropy(mtp_logits: list[Tensor], batch: Mapping[str, Tensor]) -> list[LossTerms]:
    """Cross entropy of each MTP depth's predictions against ``mtp_labels``, one per depth."""
    labels = batch["mtp_labels"]
    return [
        cross_entropy_loss(logits, {"labels": labels[..., depth]})
        for depth, logits in enumerate(mtp_logits)
    ]
