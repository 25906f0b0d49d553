"""`cstack plan`: what a training layout costs per GPU, before any GPU is rented.

For a model (a preset or an HF config) and a cluster it predicts, per GPU: memory of
weights, gradients and optimizer state; Newton-Schulz work; bytes moved by all-to-all
(sharded Muon's exchange, and MoE token routing); and the Muon optimizer step with and
without overlap, for the optimizer configuration the trainer runs by default (or the one
asked for). Two layouts are compared: the trainer's dual mesh (dense weights sharded on a
narrow ``dp_shard`` group, experts on a wide EP group, CP an independent factor of the
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
- sharded Muon's owners, transfers and memory passes: training.plan.muon_step runs the
  trainer's own planner (training.optim.shard_plan) on these shapes.
Not modelled: activations, FSDP's all-gathers and reduce-scatters in forward/backward,
kernel launches. Throughputs come from ``calibration.yaml`` (or ``--calibration``),
each figure stated as measured (with its command) or assumed; the text is
``training.plan.report``'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import yaml

from training.distributed.config import ParallelConfig
from training.models.deepseek_v3.config import ModelConfig
from training.optim.config import MuonConfig, NewtonSchulzConfig, Owners
from training.plan.parts import Device, Layout, Param
from training.trainer.options import option

if TYPE_CHECKING:  # it imports torch: `cstack` commands that plan nothing start without it
    from training.plan.muon_step import MuonStep

CALIBRATION_FILE = Path(__file__).with_name("calibration.yaml")
ANNOUNCED_STEP_S = 0.2  # the composer-2.5 announcement's Muon step for the 1T model
MEGATRON_STEP_S = 0.157  # Megatron-LM's published distributed Muon step (later 0.139)
FP32 = 4

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
_NS, _MUON = NewtonSchulzConfig(), MuonConfig()


class PlanError(ValueError):
    """Input the plan cannot use; the message is the one line the CLI prints."""


@dataclass(frozen=True)
class PlanConfig:
    """``cstack plan``'s options."""

    model: str = option("kimi-k2", "Preset (deepseek-v3, kimi-k2), config.json or model dir.")
    gpus: int = option(256, "GPUs in the cluster.")
    gpu: str = option("h200", "GPU type: a device of the calibration file (h200, h100, cpu).")
    dp_shard: int = option(8, "Dense-weight FSDP group of the dual mesh (narrow: one node).")
    ep: int = option(
        0, "Expert-parallel group (wide); 0: the widest that divides GPUs and experts."
    )
    cp: int = option(1, "Context-parallel group.")
    intra_node_gbps: float = option(0.0, "All-to-all GB/s per GPU inside a node (0: GPU's).")
    inter_node_gbps: float = option(0.0, "All-to-all GB/s per GPU across nodes (0: GPU's).")
    tokens_per_gpu: int = option(8192, "Tokens per GPU per step, for MoE token all-to-all.")
    ns_dtype: str = option(
        _NS.dtype, "Newton-Schulz precision (default: the trainer's).",
        choices=("float32", "bfloat16", "float16"),
    )  # fmt: skip
    ns_method: str = option(
        _NS.method, "Newton-Schulz method (default: the trainer's).", choices=("standard", "gram")
    )
    muon_owners: str = option(
        _MUON.owners, "Sharded Muon's owners (default: the trainer's).",
        choices=("job", "shard_group"),
    )  # fmt: skip
    calibration: Path | None = option(
        None, "Calibration YAML (default: training/plan/calibration.yaml).", flag="calibration"
    )

    def muon(self) -> MuonConfig:
        """The optimizer configuration predicted: the trainer's defaults but for the options."""
        ns = dataclasses.replace(_NS, dtype=self.ns_dtype, method=self.ns_method)  # type: ignore[arg-type]
        return dataclasses.replace(_MUON, owners=cast(Owners, self.muon_owners), newton_schulz=ns)


def load_device(config: PlanConfig) -> Device:
    path = config.calibration or CALIBRATION_FILE
    try:
        devices = yaml.safe_load(path.read_text())["devices"]
        names = sorted(devices)
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise PlanError(f"--calibration {path}: not a calibration file ({exc})") from exc
    if config.gpu not in devices:
        raise PlanError(f"--gpu {config.gpu}: not in {path.name} ({', '.join(names)})")
    figures = devices[config.gpu]
    if not isinstance(figures, dict):
        raise PlanError(f"--calibration {path}: device {config.gpu}: not a mapping of figures")
    fields = {f.name: f for f in dataclasses.fields(Device) if f.name != "name"}
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING]
    wrong = [n for n in required if n not in figures] or [n for n in figures if n not in fields]
    if wrong:
        problem = "missing" if wrong[0] not in figures else "unknown figure"
        raise PlanError(f"--calibration {path}: device {config.gpu}: {problem} {wrong[0]}")
    device = Device(name=config.gpu, **figures)
    missing = [d for d in ("float32", "bfloat16", "float16") if d not in device.newton_schulz_flops]
    if missing:
        raise PlanError(
            f"--calibration {path}: device {config.gpu}: no newton_schulz_flops for {missing[0]}"
        )
    basis = dict(device.basis)
    intra, inter = device.intra_node_bandwidth, device.inter_node_bandwidth
    if config.intra_node_gbps > 0:
        intra, basis["intra_node_bandwidth"] = config.intra_node_gbps * 1e9, "given (option)"
    if config.inter_node_gbps > 0:
        inter, basis["inter_node_bandwidth"] = config.inter_node_gbps * 1e9, "given (option)"
    return dataclasses.replace(
        device, intra_node_bandwidth=intra, inter_node_bandwidth=inter, basis=basis
    )


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


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    muon: MuonConfig
    weights: float  # bytes per GPU (the rank holding most)
    gradients: float
    optimizer: float
    fsdp_buffers: float
    token_bytes: float  # MoE dispatch + combine, forward + backward
    step: MuonStep  # per rank

    @property
    def memory(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.fsdp_buffers

    @property
    def rank(self) -> int:
        """The rank whose step is slowest: every figure below is its."""
        return self.step.busiest

    @property
    def ns_flops(self) -> float:
        return float(self.step.ns_flops[self.rank])

    @property
    def ns_expert_flops(self) -> float:
        return float(self.step.ns_expert_flops[self.rank])

    @property
    def ns_mean_flops(self) -> float:
        """Total Newton-Schulz work over the world size: what a perfectly even split gives."""
        return float(self.step.ns_flops.sum()) / self.layout.world

    @property
    def muon_bytes(self) -> float:
        return float(self.step.sent_bytes[self.rank])

    @property
    def ns_seconds(self) -> float:
        return float(self.step.ns_seconds[self.rank])

    @property
    def exchange_seconds(self) -> float:
        return float(self.step.exchange_seconds[self.rank])

    @property
    def elementwise_seconds(self) -> float:
        return float(self.step.elementwise_seconds[self.rank])

    @property
    def overlapped(self) -> float:
        return float(self.step.overlapped[self.rank])

    @property
    def serial(self) -> float:
        return float(self.step.serial[self.rank])


def estimate(
    params: list[Param], model: ModelConfig, layout: Layout, device: Device, tokens: int,
    muon: MuonConfig,
) -> Estimate:  # fmt: skip
    from training.plan.muon_step import muon_step

    muon_numel = sum(local_numel(p, layout, 0) for p in params if p.muon)
    adamw_numel = sum(local_numel(p, layout, 0) for p in params if not p.muon)
    adamw = np.zeros(layout.world)
    for p in params:
        if not p.muon:
            adamw += [local_numel(p, layout, rank) for rank in range(layout.world)]
    layer_numel: dict[str, int] = {}
    for p in params:
        if p.name.startswith("model.layers.") and not p.expert:
            layer = p.name.split(".")[2]
            layer_numel[layer] = layer_numel.get(layer, 0) + p.numel
    moe_layers = sum(model.is_moe_layer(i) for i in range(model.num_hidden_layers))
    leaving = (layout.ep - 1) / layout.ep
    token_bytes = tokens * model.num_experts_per_tok * model.hidden_size * FP32 * leaving
    return Estimate(
        layout=layout,
        muon=muon,
        weights=(muon_numel + adamw_numel) * FP32,
        gradients=(muon_numel + adamw_numel) * FP32,
        optimizer=(muon_numel + 2 * adamw_numel) * FP32,
        # Unsharded weights of the layer computing and the one prefetched, and one layer's
        # unsharded gradients before their reduce-scatter.
        fsdp_buffers=3 * max(layer_numel.values(), default=0) * FP32,
        token_bytes=token_bytes * moe_layers * 4,
        step=muon_step(params, layout, device, muon, adamw),
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
    muon, tokens = config.muon(), config.tokens_per_gpu
    estimates = [estimate(params, model, lay, device, tokens, muon) for lay in layouts_]
    return Plan(config, model, device, params, estimates)
