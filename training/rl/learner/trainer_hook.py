"""GRPO + hint KL as a loss hook of the trainer core (training.Trainer.train_step).

The trainer divides a hook's ``loss_sum`` by the global token count, and splits every
``[batch, seq, ...]`` tensor across data- and context-parallel ranks. So the batch here
is laid out on the input grid (position t predicts token t+1), and each normalisation is
folded into per-token weights computed once on the global batch: after the trainer's
division the result equals :func:`training.rl.learner.grpo_reference.rl_loss` on one process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from training.components.losses import IGNORE_INDEX, LossFn, LossTerms, token_logprobs
from training.rl.learner.batch import TurnBatch, completion_logits
from training.rl.learner.config import GRPOConfig
from training.rl.learner.losses import kl_per_token, mismatch_kl, policy_surrogate

Teacher = Callable[[Tensor], Tensor]


def _grid(rows: int, width: int, value: float = 0.0) -> Tensor:
    return torch.full((rows, width), value, dtype=torch.float32)


def trainer_batch(
    batch: TurnBatch,
    config: GRPOConfig,
    teacher: Teacher | None,
    pad_id: int = 0,
    row_multiple: int = 1,
    seq_multiple: int = 1,
) -> dict[str, Tensor]:
    """The trainer's batch: ids, shifted labels and per-token loss inputs and weights.

    ``teacher`` maps hinted ids to logits (run without gradient); rows and sequence are
    padded to multiples of the data- and context-parallel sizes with inert positions.
    """
    n_real, width = batch.input_ids.shape
    rows = -(-n_real // row_multiple) * row_multiple
    width = -(-width // seq_multiple) * seq_multiple
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    input_ids[:n_real, : batch.input_ids.shape[1]] = batch.input_ids
    labels = torch.full((rows, width), IGNORE_INDEX, dtype=torch.long)
    sampling, advantages = _grid(rows, width), _grid(rows, width)
    policy_weight, kl_weight = _grid(rows, width), _grid(rows, width)
    lengths = batch.completion_mask.sum(dim=1)
    total = float(lengths.sum())
    live_rows = int((lengths > 0).sum())
    flagged = batch.flagged_rows.tolist()
    flagged_tokens = float(lengths[batch.flagged_rows].sum()) if flagged else 0.0
    feedback = config.feedback
    for row in range(n_real):
        length = int(lengths[row])
        if length == 0:
            continue
        start = int(batch.completion_start[row])
        cols = slice(start - 1, start - 1 + length)
        labels[row, cols] = batch.completion_ids[row, :length]
        sampling[row, cols] = batch.sampling_logprobs[row, :length]
        advantages[row, cols] = batch.advantages[row]
        policy_weight[row, cols] = (
            1.0 if config.normalisation == "token" else total / (live_rows * length)
        )
        if row in flagged:
            kl_weight[row, cols] = (
                total / flagged_tokens
                if feedback.kl_normalisation == "token"
                else total / len(flagged)
            )
    out = {
        "input_ids": input_ids,
        "labels": labels,
        "sampling_logprobs": sampling,
        "advantages": advantages,
        "policy_weight": policy_weight,
    }
    if flagged and feedback.enabled and feedback.kl_coef > 0 and teacher is not None:
        length = batch.completion_ids.shape[1]
        with torch.no_grad():
            hinted = completion_logits(teacher(batch.hinted_input_ids), batch.hinted_start, length)
            hinted_logp = torch.log_softmax(hinted.float(), dim=-1)
        teacher_logp = torch.zeros(rows, width, hinted_logp.shape[-1])
        for i, row in enumerate(flagged):
            n = int(lengths[row])
            start = int(batch.completion_start[row])
            teacher_logp[row, start - 1 : start - 1 + n] = hinted_logp[i, :n]
        out["teacher_logprobs"] = teacher_logp
        out["kl_weight"] = kl_weight
    return out


def grpo_loss_hook(config: GRPOConfig) -> LossFn:
    """The trainer hook: GRPO on model tokens (corrected as ``config.correction`` says)
    plus weighted hint KL. It reports, summed over tokens, those the correction capped,
    the engine-trainer KL (``mismatch_kl``) and, on flagged tokens, how much less likely
    the hinted teacher makes them than the student (``hint_margin``)."""

    def hook(logits: Tensor, batch: Mapping[str, Tensor]) -> LossTerms:
        labels = batch["labels"]
        mask = (labels != IGNORE_INDEX).float()
        logprobs = token_logprobs(logits, labels)
        sampling = batch["sampling_logprobs"]
        per_token, capped = policy_surrogate(logprobs, sampling, batch["advantages"], config)
        loss_sum = (per_token * mask * batch["policy_weight"]).sum()
        metrics = {
            "capped_tokens": (capped.float() * mask).sum().detach(),
            "mismatch_kl": (mismatch_kl(logprobs, sampling) * mask).sum().detach(),
        }
        if "teacher_logprobs" in batch:
            teacher = batch["teacher_logprobs"]
            kl = kl_per_token(logits, teacher) * batch["kl_weight"]
            loss_sum = loss_sum + config.feedback.kl_coef * kl.sum()
            metrics["hint_kl_weighted"] = kl.sum().detach()
            # How much less likely the teacher makes the flagged tokens than the student.
            flagged = (batch["kl_weight"] > 0).float() * mask
            teacher_logp = teacher.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            margin = (logprobs.detach() - teacher_logp) * flagged
            metrics["hint_margin"] = margin.sum().detach()
            metrics["flagged_tokens"] = flagged.sum().detach()
        return LossTerms(loss_sum=loss_sum, tokens=mask.sum(), metrics=metrics)

    return hook
