"""Apply parallelism to a finished DeepseekV3Model (plain functions, torchtitan style).

Order matters: experts become DTensors on the expert mesh first, so FSDP2 (which shards
every remaining parameter on the dense mesh) can be told to leave them alone.

Gradient convention: every rank backpropagates its own share of the global loss (sum of
its token losses divided by the global token count), and every reduction *sums*. FSDP2's
default averages (ReduceOp.AVG; on torch 2.13 gloo that did average, checked with HSDP
2x2), and a custom divide factor uses PREMUL_SUM, which gloo rejects ("Cannot use
ReduceOp.PREMUL_SUM with Gloo"); so FSDP2 is told to use plain SUM collectives with a
divide factor of 1, the same on gloo and NCCL. tests/training checks every gradient
against a single-process reference.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from training.distributed.context_parallel import ContextParallel
from training.distributed.expert_parallel import ExpertParallel
from training.distributed.mesh import Meshes
from training.models.deepseek_v3.attention import MLAttention
from training.models.deepseek_v3.model import DeepseekV3Model
from training.models.deepseek_v3.moe import MoE


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in model.modules() if isinstance(m, MoE) for p in m.experts.parameters()]


def apply_expert_parallel(model: DeepseekV3Model, meshes: Meshes) -> None:
    """Shard routed experts by expert index over the EP group; tokens go to them."""
    mesh = meshes.expert
    ep_group = mesh.get_group("ep")
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        for name, param in list(module.experts.named_parameters()):
            sharded = distribute_tensor(param.detach(), mesh, [Replicate(), Shard(0)])
            module.experts.register_parameter(name, nn.Parameter(sharded))
        if mesh.size(1) > 1:
            module.expert_parallel = ExpertParallel(
                group=ep_group,
                rank=mesh.get_local_rank("ep"),
                size=mesh.size(1),
                num_experts=module.config.n_routed_experts,
            )


def apply_context_parallel(model: DeepseekV3Model, meshes: Meshes) -> None:
    size = meshes.context.size(1)
    if size == 1:
        return
    cp = ContextParallel(meshes.cp_group, meshes.context.get_local_rank("cp"), size)
    for module in model.modules():
        if isinstance(module, MLAttention):
            module.context_parallel = cp


def apply_fsdp(model: DeepseekV3Model, meshes: Meshes, mp: MixedPrecisionPolicy) -> None:
    """HSDP on the dense mesh, one FSDP unit per decoder layer plus the root."""
    ignored = set(expert_parameters(model))
    for layer in model.model.layers:
        fully_shard(layer, mesh=meshes.dense, mp_policy=mp, ignored_params=ignored)
    fully_shard(model, mesh=meshes.dense, mp_policy=mp, ignored_params=ignored)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # Plain SUM collectives: gloo has neither AVG nor PREMUL_SUM for reduce-scatter.
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(1.0)


def parallelize(
    model: DeepseekV3Model, meshes: Meshes, mp: MixedPrecisionPolicy | None = None
) -> DeepseekV3Model:
    apply_expert_parallel(model, meshes)
    apply_context_parallel(model, meshes)
    apply_fsdp(model, meshes, mp or MixedPrecisionPolicy())
    return model


def reduce_expert_gradients(model: nn.Module, meshes: Meshes) -> None:
    """Sum expert gradients over the expert-replicate dimension (FSDP does not own them)."""
    mesh = meshes.expert
    if mesh.size(0) == 1:
        return
    group = mesh.get_group("expert_replicate")
    for param in expert_parameters(model):
        if param.grad is not None:
            grad: Tensor = param.grad.to_local()  # type: ignore[attr-defined]
            dist.all_reduce(grad, group=group)
