"""Two layouts from one world: a dense HSDP mesh and an expert mesh, plus CP groups.

Non-expert weights live on a (replicate, shard) mesh whose shard groups are narrow
(consecutive ranks, e.g. one node) so FSDP's per-layer all-gathers stay on fast links.
Routed experts live on their own (expert_replicate, ep) mesh with a wide EP group: each EP
rank holds ``E / ep`` whole experts and tokens travel to them. Context parallelism groups
``cp`` consecutive ranks that share the same samples and split their sequence.

The dimensions are independent factorisations of the same world rather than axes of one
shared mesh, so world 8 runs CP=2 with EP=8 (one mesh would need 2 x 8 = 16 ranks).
Everything is checked by :func:`ParallelConfig.validate` before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from training.model_config import ModelConfig


class ParallelConfigError(ValueError):
    """A world size or shape the meshes cannot factor; the message names the constraint."""


@dataclass(frozen=True)
class ParallelConfig:
    world_size: int = 1
    dp_shard: int = 1  # FSDP shard group size for dense weights (narrow)
    cp: int = 1  # context-parallel group size
    ep: int = 1  # expert-parallel group size (wide)

    @property
    def dp_replicate(self) -> int:
        return self.world_size // self.dp_shard

    @property
    def data_parallel(self) -> int:
        """How many different sample shards the world holds (CP ranks share samples)."""
        return self.world_size // self.cp

    def validate(self, model: ModelConfig, batch_size: int, seq_len: int) -> None:
        world = self.world_size
        for name, size in (("dp_shard", self.dp_shard), ("cp", self.cp), ("ep", self.ep)):
            if size < 1 or world % size:
                raise ParallelConfigError(f"world size {world} is not divisible by {name}={size}")
        if self.ep > 1 and model.n_routed_experts % self.ep:
            raise ParallelConfigError(
                f"n_routed_experts={model.n_routed_experts} is not divisible by ep={self.ep}"
            )
        if seq_len % self.cp:
            raise ParallelConfigError(f"seq_len={seq_len} is not divisible by cp={self.cp}")
        if batch_size % self.data_parallel:
            raise ParallelConfigError(
                f"batch_size={batch_size} is not divisible by the data-parallel degree "
                f"world/cp={self.data_parallel}"
            )


@dataclass
class Meshes:
    """The process layout of one rank."""

    dense: DeviceMesh  # ("replicate", "shard")
    expert: DeviceMesh  # ("expert_replicate", "ep")
    context: DeviceMesh  # ("dp", "cp")

    @property
    def cp_group(self) -> dist.ProcessGroup:
        return self.context.get_group("cp")

    @property
    def dp_rank(self) -> int:
        """Which sample shard this rank reads."""
        return self.context.get_local_rank("dp")


def build_meshes(config: ParallelConfig, device_type: str) -> Meshes:
    world = config.world_size
    return Meshes(
        dense=init_device_mesh(
            device_type,
            (config.dp_replicate, config.dp_shard),
            mesh_dim_names=("replicate", "shard"),
        ),
        expert=init_device_mesh(
            device_type, (world // config.ep, config.ep), mesh_dim_names=("expert_replicate", "ep")
        ),
        context=init_device_mesh(
            device_type, (world // config.cp, config.cp), mesh_dim_names=("dp", "cp")
        ),
    )
