"""Turn groups of trajectories into the padded tensors the losses need.

Each model turn becomes one row: its exact prompt ids followed by its exact completion
ids, as vLLM saw and produced them. Only the completion positions carry loss, so tool
results and prompts (which reappear inside later turns' prompts) never do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from training.rl.feedback import Encode, hinted_prompt
from training.rl.learner.config import GRPOConfig
from training.rl.learner.losses import group_advantages
from training.rl.trajectory import Trajectory


@dataclass
class TurnBatch:
    """Row n is one turn; ``completion_*`` tensors are [N, L] aligned to completion tokens."""

    input_ids: torch.Tensor
    completion_start: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampling_logprobs: torch.Tensor
    advantages: torch.Tensor
    flagged_rows: torch.Tensor
    hinted_input_ids: torch.Tensor
    hinted_start: torch.Tensor
    rewards: torch.Tensor


def _pad(rows: Sequence[Sequence[int]], pad: int) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    return out


def build_batch(
    groups: Sequence[Sequence[Trajectory]],
    config: GRPOConfig,
    encode: Encode | None,
    pad_id: int = 0,
    min_version: int | None = None,
) -> TurnBatch:
    """Advantages are computed per group (same task), then spread over every turn, except
    turns sampled by a policy older than ``min_version``: a partial rollout's early turns
    past the staleness bound are left out (its reward still counts for its group)."""
    inputs: list[list[int]] = []
    starts: list[int] = []
    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    advantages: list[float] = []
    flagged: list[int] = []
    hinted: list[list[int]] = []
    hinted_starts: list[int] = []
    rewards: list[float] = []
    feedback = config.feedback
    for group in groups:
        group_rewards = torch.tensor([t.reward for t in group], dtype=torch.float32)
        rewards.extend(group_rewards.tolist())
        group_adv = group_advantages(group_rewards, config.scale_by_std, config.std_eps)
        for trajectory, advantage in zip(group, group_adv.tolist(), strict=True):
            hints = {mark.turn_index: mark.hint for mark in trajectory.feedback}
            for turn in trajectory.turns:
                if not turn.completion_token_ids:
                    continue
                if min_version is not None and turn.policy_version < min_version:
                    continue
                if len(turn.completion_logprobs) != len(turn.completion_token_ids):
                    raise ValueError(
                        f"trajectory {trajectory.trajectory_id} turn {turn.index}: "
                        "logprobs and completion token ids differ in length"
                    )
                row = len(inputs)
                inputs.append(turn.prompt_token_ids + turn.completion_token_ids)
                starts.append(len(turn.prompt_token_ids))
                completions.append(turn.completion_token_ids)
                logprobs.append(turn.completion_logprobs)
                advantages.append(advantage)
                if feedback.enabled and turn.index in hints and encode is not None:
                    prompt = hinted_prompt(
                        turn.prompt_token_ids, hints[turn.index], feedback, encode
                    )
                    flagged.append(row)
                    hinted.append(prompt + turn.completion_token_ids)
                    hinted_starts.append(len(prompt))
    completion_ids = _pad(completions, pad_id)
    mask = torch.zeros_like(completion_ids, dtype=torch.bool)
    sampled = torch.zeros(completion_ids.shape, dtype=torch.float32)
    for i, (ids, lps) in enumerate(zip(completions, logprobs, strict=True)):
        mask[i, : len(ids)] = True
        sampled[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
    return TurnBatch(
        input_ids=_pad(inputs, pad_id),
        completion_start=torch.tensor(starts, dtype=torch.long),
        completion_ids=completion_ids,
        completion_mask=mask,
        sampling_logprobs=sampled,
        advantages=torch.tensor(advantages, dtype=torch.float32),
        flagged_rows=torch.tensor(flagged, dtype=torch.long),
        hinted_input_ids=_pad(hinted, pad_id),
        hinted_start=torch.tensor(hinted_starts, dtype=torch.long),
        rewards=torch.tensor(rewards, dtype=torch.float32),
    )


def completion_logits(logits: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """Pick the logits that predict completion token j: position ``start + j - 1``.

    ``logits`` [N, T, V] -> [N, length, V]; positions past a row's end are clamped (the
    mask hides them).
    """
    positions = starts.unsqueeze(1) - 1 + torch.arange(length).unsqueeze(0)
    positions = positions.clamp(min=0, max=logits.shape[1] - 1)
    index = positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return logits.gather(1, index)
