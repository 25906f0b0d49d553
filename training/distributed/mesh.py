"""Two layouts from one world: a dense HSDP mesh and an expert mesh, plus CP groups.

Non-expert weights live on a (replicate, shard) mesh whose shard groups are narrow
(consecutive ranks, e.g. one node) so FSDP's per-layer all-gathers stay on fast links.
Routed experts live on their own (expert_replicate, ep) mesh with a wide EP group: each EP
rank holds ``E / ep`` whole experts and tokens travel to them. Context parallelism groups
``cp`` consecutive ranks that share the same samples and split their sequence.

The dimensions are independent factorisations of the same world rather than axes of one
shared mesh, so world 8 runs CP=2 with EP=8 (one mesh would need 2 x 8 = 16 ranks).
Everything is checked by ``ParallelConfig.validate`` (``config``) before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from training.distributed.config import ParallelConfig


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
