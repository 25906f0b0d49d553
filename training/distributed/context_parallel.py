"""Context parallelism: the sequence is split across a group, K/V gathered in attention.

Each rank of a CP group holds one contiguous chunk of every sequence. Everything except
attention is per token, so only attention needs the other chunks: it all-gathers MLA's
compressed K/V latent (``kv_lora_rank + qk_rope_head_dim`` per token, the same thing
serving caches, far smaller than the per-head K and V) and masks causally by global
position. The gather's backward sums every rank's gradient back onto the owner, so the
result and its gradients are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import Tensor

from training.distributed.collectives import all_gather_dim0


@dataclass(frozen=True)
class ContextParallel:
    group: dist.ProcessGroup
    rank: int
    size: int

    def local_chunk(self, tensor: Tensor, dim: int = 1) -> Tensor:
        """This rank's contiguous chunk of ``tensor`` along the sequence dimension."""
        length = tensor.shape[dim]
        if length % self.size:
            raise ValueError(f"sequence length {length} must be divisible by CP size {self.size}")
        chunk = length // self.size
        return tensor.narrow(dim, self.rank * chunk, chunk)

    def gather_sequence(self, tensor: Tensor, dim: int = 1) -> Tensor:
        """All ranks' chunks concatenated along ``dim`` (differentiable)."""
        moved = tensor.movedim(dim, 0)
        gathered = all_gather_dim0(moved, self.group)
        return gathered.movedim(0, dim)
