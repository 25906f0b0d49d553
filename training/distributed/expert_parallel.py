"""Expert parallelism: routed tokens travel to the rank holding their expert and back.

Expert ``e`` lives on EP rank ``e // (E / ep)``. Tokens arrive sorted by expert, so the
rows for each destination rank are contiguous: one ``all_to_all_single`` of per-expert
counts, one of the hidden states (dispatch), local expert compute, and one more of the
outputs (combine). Both data exchanges are differentiable (their backward is the reverse
exchange), which is how expert gradients from every rank's tokens reach the owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from training.distributed.collectives import all_to_all_single, exchange


class LocalExperts(Protocol):
    def __call__(self, x: Tensor, counts: list[int]) -> Tensor: ...


@dataclass(frozen=True)
class ExpertParallel:
    group: dist.ProcessGroup
    rank: int
    size: int
    num_experts: int

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.size

    def run(self, routed: Tensor, counts: Tensor, experts: LocalExperts) -> Tensor:
        """``routed`` rows sorted by global expert; ``counts`` [E] rows per expert."""
        local = self.local_experts
        send_counts = counts.view(self.size, local)
        recv_counts = exchange(send_counts, [1] * self.size, [1] * self.size, self.group)
        input_splits = send_counts.sum(1).tolist()
        output_splits = recv_counts.sum(1).tolist()
        received = all_to_all_single(routed, output_splits, input_splits, self.group)
        # Received rows are grouped by source rank, then expert; regroup by expert.
        expert_of_row = torch.repeat_interleave(
            torch.arange(local, device=routed.device).repeat(self.size), recv_counts.flatten()
        )
        perm = torch.argsort(expert_of_row, stable=True)
        out = experts(received[perm], recv_counts.sum(0).tolist())
        restored = out[torch.argsort(perm)]
        return all_to_all_single(restored, input_splits, output_splits, self.group)
