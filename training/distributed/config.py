"""The process layout's sizes, checkable before any process starts (no torch import)."""

from __future__ import annotations

from dataclasses import dataclass, field


class ParallelConfigError(ValueError):
    """A world size or shape the meshes cannot factor; the message names the constraint."""


@dataclass(frozen=True)
class ParallelConfig:
    world_size: int = 1
    dp_shard: int = field(default=1, metadata={"help": "FSDP shard group size (dense weights)."})
    cp: int = field(default=1, metadata={"help": "Context-parallel group size."})
    ep: int = field(default=1, metadata={"help": "Expert-parallel group size."})

    @property
    def dp_replicate(self) -> int:
        return self.world_size // self.dp_shard

    @property
    def data_parallel(self) -> int:
        """How many different sample shards the world holds (CP ranks share samples)."""
        return self.world_size // self.cp

    def validate(self, n_routed_experts: int, batch_size: int, seq_len: int) -> None:
        world = self.world_size
        for name, size in (("dp_shard", self.dp_shard), ("cp", self.cp), ("ep", self.ep)):
            if size < 1 or world % size:
                raise ParallelConfigError(f"world size {world} is not divisible by {name}={size}")
        if self.ep > 1 and n_routed_experts % self.ep:
            raise ParallelConfigError(
                f"n_routed_experts={n_routed_experts} is not divisible by ep={self.ep}"
            )
        if seq_len % self.cp:
            raise ParallelConfigError(f"seq_len={seq_len} is not divisible by cp={self.cp}")
        if batch_size % self.data_parallel:
            raise ParallelConfigError(
                f"batch_size={batch_size} is not divisible by the data-parallel degree "
                f"world/cp={self.data_parallel}"
            )
