"""`cstack plan`: what a training layout costs per GPU, before any GPU is rented.

For a model (a preset or an HF config) and a cluster it predicts, per GPU: memory of
weights, gradients and optimizer state; Newton-Schulz work; bytes moved by all-to-all
(sharded Muon's exchange, and MoE token routing); and the Muon optimizer step with and
without overlap. Two layouts are compared: the trainer's dual mesh (dense weights sharded
on a narrow ``dp_shard`` group, experts on a wide EP group, CP an independent factor of the
same world; training.distributed.mesh) and a single shared mesh (replicate x cp x ep,
dense weights sharded over cp x ep as torchtitan shards over dp_shard x cp, so one replica
needs cp x ep GPUs).

What it follows, from the code rather than restated:
- the parameters, their Muon matrices and their optimizer: the real model built on the
  meta device and ``training.optim.muon.matrix_layouts``;
- fp32 weights, gradients and state (the trainer builds the model in fp32 and FSDP2 keeps
  that dtype): Muon holds one momentum buffer, AdamW two moments;
- dense weights are ``Shard(0)`` with torch.chunk rows, so the first rank holds
  ceil(rows / dp_shard) rows; experts sit whole, E / ep per rank, replicated world / ep times;
- sharded Muon (training.optim.shard_plan): a matrix one rank holds whole stays there,
  others go to the least-loaded rank (at most ceil(N / W) per rank and shape), and every
  piece held elsewhere travels there and back.
Not modelled: activations, FSDP's all-gathers and reduce-scatters in forward/backward,
kernel launches. Throughputs come from ``plan_calibration.yaml``; the text is
``plan_report``'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from training.distributed.config import ParallelConfig
from training.models.deepseek_v3.config import ModelConfig
from training.trainer.options import option

CALIBRATION_FILE = Path(__file__).with_name("plan_calibration.yaml")
ANNOUNCED_STEP_S = 0.2  # the composer-2.5 announcement's Muon step for the 1T model
MEGATRON_STEP_S = 0.157  # Megatron-LM's published distributed Muon step
FP32 = 4
# Bytes of memory traffic per element of the elementwise optimizer work: Muon reads and
# writes momentum, gradient, Nesterov update, the gathered/scattered flat copies and the
# weight (~15 fp32 passes); AdamW its two moments, denominator and the weight (~17).
MUON_TRAFFIC, ADAMW_TRAFFIC = 60, 68
NS_STEPS = 5

_COMMON: dict[str, Any] = dict(
    hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
    qk_rope_head_dim=64, v_head_dim=128, num_experts_per_tok=8, n_shared_experts=1,
)  # fmt: skip
PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeek-V3 trains one MTP layer (its checkpoint's layer 61, 14B more parameters);
    # Kimi K2's checkpoint has none.
    "deepseek-v3": dict(_COMMON, vocab_size=129280, first_k_dense_replace=3,
                        num_attention_heads=128, n_routed_experts=256, n_group=8, topk_group=4,
                        num_nextn_predict_layers=1),
    "kimi-k2": dict(_COMMON, vocab_size=163840, first_k_dense_replace=1,
                    num_attention_heads=64, n_routed_experts=384, routed_scaling_factor=2.827),
}  # fmt: skip


class PlanError(ValueError):
    """Input the plan cannot use; the message is the one line the CLI prints."""


@dataclass(frozen=True)
class PlanConfig:
    """``cstack plan``'s options."""

    model: str = option("kimi-k2", "Preset (deepseek-v3, kimi-k2), config.json or model dir.")
    gpus: int = option(256, "GPUs in the cluster.")
    gpu: str = option("h200", "GPU type (plan_calibration.yaml).", choices=("h200", "h100", "cpu"))
    dp_shard: int = option(8, "Dense-weight FSDP group of the dual mesh (narrow: one node).")
    ep: int = option(
        0, "Expert-parallel group (wide); 0: the widest that divides GPUs and experts."
    )
    cp: int = option(1, "Context-parallel group.")
    intra_node_gbps: float = option(0.0, "All-to-all GB/s per GPU inside a node (0: GPU's).")
    inter_node_gbps: float = option(0.0, "All-to-all GB/s per GPU across nodes (0: GPU's).")
    tokens_per_gpu: int = option(8192, "Tokens per GPU per step, for MoE token all-to-all.")


@dataclass(frozen=True)
class Device:
    name: str
    source: str
    newton_schulz_flops: float
    newton_schulz_flops_bf16: float
    memory_bandwidth: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    memory_bytes: float
    gpus_per_node: int


def load_device(config: PlanConfig, path: Path = CALIBRATION_FILE) -> Device:
    figures = yaml.safe_load(path.read_text())["devices"][config.gpu]
    device = Device(name=config.gpu, **figures)
    if config.intra_node_gbps > 0:
        device = dataclasses.replace(device, intra_node_bandwidth=config.intra_node_gbps * 1e9)
    if config.inter_node_gbps > 0:
        device = dataclasses.replace(device, inter_node_bandwidth=config.inter_node_gbps * 1e9)
    return device


def load_model_config(model: str) -> ModelConfig:
    if model in PRESETS:
        return ModelConfig(**PRESETS[model])
    path = Path(model)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise PlanError(f"--model {model}: not a preset ({', '.join(PRESETS)}) nor a config file")
    try:
        return ModelConfig.from_hf_dict(json.loads(file.read_text()))
    except (ValueError, TypeError) as exc:
        raise PlanError(f"--model {model}: {exc}") from exc


@dataclass(frozen=True)
class Param:
    """One parameter as the trainer holds it; Muon matrices are ``count`` of ``matrix``."""

    name: str
    shape: tuple[int, ...]
    expert: bool
    muon: bool
    split: str = "whole"
    matrix: tuple[int, int] = (0, 0)
    count: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def model_params(config: ModelConfig) -> list[Param]:
    import torch

    from training.models.deepseek_v3.model import DeepseekV3Model
    from training.optim.muon import matrix_layouts

    with torch.device("meta"):
        model = DeepseekV3Model(config)
    layouts, _ = matrix_layouts(model)
    by_id = {id(p): layout for p, layout in layouts.items()}
    params = []
    for name, tensor in model.named_parameters():
        shape, layout = tuple(tensor.shape), by_id.get(id(tensor))
        expert = ".experts." in name
        if layout is None:
            params.append(Param(name, shape, expert, muon=False))
        else:
            params.append(Param(name, shape, expert, True, layout.split.value,
                                layout.matrix_shape(shape), layout.count(shape)))  # fmt: skip
    return params


@dataclass(frozen=True)
class Layout:
    name: str
    world: int
    dense_group: int  # ranks each dense weight is sharded over
    ep: int
    cp: int


def layouts(config: PlanConfig, model: ModelConfig) -> list[Layout]:
    if config.gpus < 1:
        raise PlanError("--gpus must be >= 1")
    ep = config.ep or math.gcd(config.gpus, model.n_routed_experts)
    parallel = ParallelConfig(config.gpus, config.dp_shard, config.cp, ep)
    try:
        parallel.validate(model.n_routed_experts, parallel.data_parallel, config.cp)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    replica = config.cp * ep
    shared_world = max(1, -(-config.gpus // replica)) * replica
    return [
        Layout("dual mesh", config.gpus, config.dp_shard, ep, config.cp),
        Layout("shared mesh", shared_world, replica, ep, config.cp),
    ]


def local_numel(param: Param, layout: Layout, rank: int) -> int:
    """Elements of ``param`` that ``rank`` holds (its ``to_local()`` in the trainer)."""
    from training.optim.shard_plan import shard_rows

    if param.expert:
        return param.numel // layout.ep
    start, end = shard_rows(param.shape[0], layout.dense_group, rank % layout.dense_group)
    return (end - start) * (param.numel // param.shape[0])


def _held(param: Param, world: int) -> np.ndarray:
    """[matrices, world]: elements of each Muon matrix of ``param`` that each rank holds."""
    from training.optim.shard_plan import shard_rows

    m, n = param.matrix
    rows, index = param.shape[0], np.arange(param.count)
    if param.split == "row_blocks":
        first, last, per_row = index * m, (index + 1) * m, n
    elif param.split == "stacked":
        first, last, per_row = index, index + 1, m * n
    else:  # whole, or column blocks: every matrix spans all rows
        first, last = np.zeros_like(index), np.full_like(index, rows)
        per_row = n if param.split == "col_blocks" else param.numel // rows
    starts, ends = np.array([shard_rows(rows, world, q) for q in range(world)]).T
    overlap = np.minimum(last[:, None], ends) - np.maximum(first[:, None], starts)
    return np.clip(overlap, 0, None) * per_row  # type: ignore[no-any-return]


def dense_exchange(params: list[Param], world: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: Newton-Schulz FLOPs owned and fp32 elements sent by sharded Muon for the
    dense matrices on a group of ``world`` ranks, owners chosen as shard_plan chooses."""
    from training.optim.newton_schulz import flops

    load, sent = np.zeros(world), np.zeros(world)
    groups: dict[tuple[int, int], list[np.ndarray]] = {}
    for p in params:
        if p.muon and not p.expert:
            groups.setdefault(p.matrix, []).append(_held(p, world))
    ranks = np.arange(world)
    for (m, n), parts in groups.items():
        held = np.concatenate(parts)
        cost, size, target = float(flops(m, n, NS_STEPS)), m * n, -(-len(held) // world)
        owned, owner = np.zeros(world, dtype=np.int64), np.full(len(held), -1)
        for j in np.flatnonzero((held == size).any(axis=1)):
            whole = int(np.argmax(held[j] == size))
            if owned[whole] < target:
                owner[j] = whole
                owned[whole] += 1
                load[whole] += cost
        for j in np.flatnonzero(owner < 0):
            # Lexicographic (full, load, -held, rank): np.lexsort sorts by its last key first.
            q = int(np.lexsort((ranks, -held[j], load, owned >= target))[0])
            owner[j] = q
            owned[q] += 1
            load[q] += cost
        at_owner = held[np.arange(len(held)), owner]
        sent += held.sum(axis=0)
        np.subtract.at(sent, owner, at_owner)
        np.add.at(sent, owner, size - at_owner)
    return load, sent


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    weights: float  # bytes per GPU (the rank holding most)
    gradients: float
    optimizer: float
    fsdp_buffers: float
    ns_dense: float  # FLOPs per GPU (the busiest rank)
    ns_experts: float
    muon_bytes: float  # all-to-all bytes one GPU sends in a Muon step
    token_bytes: float  # MoE dispatch + combine, forward + backward
    ns_seconds: float
    exchange_seconds: float
    elementwise_seconds: float
    buckets: int  # (process group, matrix shape) groups the exchange is pipelined over

    @property
    def memory(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.fsdp_buffers

    @property
    def serial(self) -> float:
        return self.ns_seconds + self.exchange_seconds + self.elementwise_seconds

    @property
    def overlapped(self) -> float:
        # Exchanges of later groups hide behind Newton-Schulz of earlier ones; the first
        # gather and the last return (about one group's share) cannot.
        hidden = max(self.ns_seconds, self.exchange_seconds)
        exposed = min(self.ns_seconds, self.exchange_seconds) / max(self.buckets, 1)
        return hidden + exposed + self.elementwise_seconds


def link_seconds(nbytes: float, group: int, device: Device) -> float:
    """All-to-all time: consecutive ranks, so a group wider than a node crosses nodes."""
    if group <= 1:
        return 0.0
    off_node = max(0, group - device.gpus_per_node) / (group - 1)
    return max(
        nbytes * (1 - off_node) / device.intra_node_bandwidth,
        nbytes * off_node / device.inter_node_bandwidth,
    )


def estimate(
    params: list[Param], model: ModelConfig, layout: Layout, device: Device, tokens: int
) -> Estimate:
    from training.optim.newton_schulz import flops

    muon = sum(local_numel(p, layout, 0) for p in params if p.muon)
    adamw = sum(local_numel(p, layout, 0) for p in params if not p.muon)
    layer_numel: dict[str, int] = {}
    for p in params:
        if p.name.startswith("model.layers.") and not p.expert:
            layer = p.name.split(".")[2]
            layer_numel[layer] = layer_numel.get(layer, 0) + p.numel
    load, sent = dense_exchange(params, layout.dense_group)
    ns_experts = sum(
        p.count // layout.ep * flops(*p.matrix, NS_STEPS) for p in params if p.muon and p.expert
    )
    moe_layers = sum(model.is_moe_layer(i) for i in range(model.num_hidden_layers))
    leaving = (layout.ep - 1) / layout.ep
    token_bytes = tokens * model.num_experts_per_tok * model.hidden_size * FP32 * leaving
    busiest = float(load.max())
    ns_seconds = (busiest + ns_experts) / device.newton_schulz_flops
    shapes = {p.matrix for p in params if p.muon and not p.expert}
    return Estimate(
        layout=layout,
        weights=(muon + adamw) * FP32,
        gradients=(muon + adamw) * FP32,
        optimizer=(muon + 2 * adamw) * FP32,
        # Unsharded weights of the layer computing and the one prefetched, and one layer's
        # unsharded gradients before their reduce-scatter.
        fsdp_buffers=3 * max(layer_numel.values(), default=0) * FP32,
        ns_dense=busiest,
        ns_experts=ns_experts,
        muon_bytes=float(sent.max()) * FP32,
        token_bytes=token_bytes * moe_layers * 4,
        ns_seconds=ns_seconds,
        exchange_seconds=link_seconds(float(sent.max()) * FP32, layout.dense_group, device),
        elementwise_seconds=(muon * MUON_TRAFFIC + adamw * ADAMW_TRAFFIC) / device.memory_bandwidth,
        buckets=len(shapes) + len({p.matrix for p in params if p.muon and p.expert}),
    )


@dataclass(frozen=True)
class Plan:
    config: PlanConfig
    model: ModelConfig
    device: Device
    params: list[Param]
    estimates: list[Estimate]  # dual mesh, then shared mesh


def plan(config: PlanConfig) -> Plan:
    """Both layouts' estimates; raises ``PlanError`` on input it cannot use."""
    if config.tokens_per_gpu < 0:
        raise PlanError("--tokens-per-gpu must be >= 0")
    model = load_model_config(config.model)
    device = load_device(config)
    layouts_ = layouts(config, model)
    params = model_params(model)
    estimates = [estimate(params, model, lay, device, config.tokens_per_gpu) for lay in layouts_]
    return Plan(config, model, device, params, estimates)
