"""The text `cstack plan` prints: both layouts side by side for the optimizer configuration
predicted, other configurations for comparison, the verdict against the published Muon
step times, where the time goes, and what each throughput rests on (training.plan.plan computes
the figures)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from training.optim.config import MuonConfig
from training.plan.plan import (
    ANNOUNCED_STEP_S,
    MEGATRON_STEP_S,
    Estimate,
    Plan,
    PlanConfig,
    estimate,
    plan,
)

GB, TFLOP = 1e9, 1e12
# Other optimizer configurations the report predicts for the dual mesh.
# (Shard-group owners, the layout before, plan every replica's copies: slower to plan,
# so asked for with --muon-owners shard_group rather than shown every time.)
ALTERNATIVES: list[tuple[str, dict[str, str]]] = [
    ("float32 standard", {"ns_dtype": "float32", "ns_method": "standard"}),
    ("bfloat16 standard", {"ns_dtype": "bfloat16", "ns_method": "standard"}),
]


def describe(muon: MuonConfig) -> str:
    ns = muon.newton_schulz
    method = "Gram (standard for square)" if ns.method == "gram" else "standard"
    owners = {"job": "job-wide", "shard_group": "shard-group"}[muon.owners]
    return f"Newton-Schulz {ns.dtype}, {method}, {ns.steps} steps; {owners} owners"


def _table(result: Plan) -> list[str]:
    device, config = result.device, result.config
    sections: list[tuple[str, list[tuple[str, Callable[[Estimate], str]]]]] = [
        ("", [
            ("", lambda e: e.layout.name),
            ("dense group / EP / CP",
             lambda e: f"{e.layout.dense_group} / {e.layout.ep} / {e.layout.cp}"),
            ("GPUs", lambda e: str(e.layout.world)),
        ]),
        ("memory per GPU (GB)", [
            ("weights", lambda e: f"{e.weights / GB:.1f}"),
            ("gradients", lambda e: f"{e.gradients / GB:.1f}"),
            ("optimizer state (Muon 1x, AdamW 2x)", lambda e: f"{e.optimizer / GB:.1f}"),
            ("FSDP unsharded layer buffers", lambda e: f"{e.fsdp_buffers / GB:.1f}"),
            (f"total (of {device.memory_bytes / GB:.0f}; no activations)",
             lambda e: f"{e.memory / GB:.1f}"),
        ]),
        ("Newton-Schulz per GPU per step (TFLOP)", [
            ("busiest rank", lambda e: f"{e.ns_flops / TFLOP:.2f}"),
            ("  of it routed experts", lambda e: f"{e.ns_expert_flops / TFLOP:.2f}"),
            ("  of it dense matrices",
             lambda e: f"{(e.ns_flops - e.ns_expert_flops) / TFLOP:.2f}"),
            ("even split (total / GPUs)", lambda e: f"{e.ns_mean_flops / TFLOP:.2f}"),
        ]),
        ("all-to-all per GPU per step (GB sent, busiest rank)", [
            ("sharded Muon exchange", lambda e: f"{e.muon_bytes / GB:.2f}"),
            (f"MoE tokens ({config.tokens_per_gpu} tokens/GPU)",
             lambda e: f"{e.token_bytes / GB:.2f}"),
        ]),
        ("Muon optimizer step (s, busiest rank)", [
            ("Newton-Schulz", lambda e: f"{e.ns_seconds:.3f}"),
            ("exchange (all-to-all)", lambda e: f"{e.exchange_seconds:.3f}"),
            ("elementwise (momentum, copies, AdamW)", lambda e: f"{e.elementwise_seconds:.3f}"),
            ("predicted, with overlap", lambda e: f"{e.overlapped:.3f}"),
            ("predicted, no overlap", lambda e: f"{e.serial:.3f}"),
        ]),
    ]  # fmt: skip
    lines = []
    for heading, rows in sections:
        if heading:
            lines.append(heading)
        for label, value in rows:
            lines.append(f"  {label:<38}" + "".join(f"{value(e):>18}" for e in result.estimates))
    return lines


def _alternatives(result: Plan) -> list[str]:
    dual = result.estimates[0]
    lines = ["Other optimizer settings (dual mesh, with overlap):"]
    for label, options in ALTERNATIVES:
        muon = dataclasses.replace(result.config, **options).muon()  # type: ignore[arg-type]
        other = estimate(result.params, result.model, dual.layout, result.device,
                         result.config.tokens_per_gpu, muon)  # fmt: skip
        lines.append(f"  {label:<58}{other.overlapped:>8.3f} s")
    return lines


def _figures(result: Plan) -> list[str]:
    device = result.device
    lines = [f"Figures for {device.name} (measured or assumed):"]
    for name, basis in device.basis.items():
        lines.append(f"  {name}: {' '.join(basis.split())}")
    step = device.sharded_step
    if step:
        lines.append(
            f"  check: a sharded Muon step measured {step['measured_s']:.3f} s against "
            f"{step['predicted_s']:.3f} s predicted ({step['what']})"
        )
    return lines


def report(config: PlanConfig) -> str:
    result = plan(config)
    model, device = result.model, result.device
    total = sum(p.numel for p in result.params)
    experts = sum(p.numel for p in result.params if p.expert)
    dual = result.estimates[0]
    defaults = config.muon() == MuonConfig()
    lines = [
        f"cstack plan: {config.model}: {total / 1e9:,.1f}B parameters ({experts / 1e9:,.1f}B in "
        f"{model.n_routed_experts} routed experts x {model.num_hidden_layers} layers, "
        f"{(total - experts) / 1e9:,.1f}B dense); fp32 weights, gradients and optimizer state",
        f"cluster: {config.gpus} x {device.name} ({device.gpus_per_node} per node, "
        f"{device.memory_bytes / GB:.0f} GB, all-to-all "
        f"{device.intra_node_bandwidth / GB:.0f} GB/s in a node, "
        f"{device.inter_node_bandwidth / GB:.0f} GB/s across)",
        f"optimizer{' (the trainer defaults)' if defaults else ''}: {describe(dual.muon)}",
        "",
        *_table(result),
        "",
    ]
    for e in result.estimates:
        if e.memory > device.memory_bytes:
            lines.append(
                f"The {e.layout.name} does not fit: {e.memory / GB:.0f} GB > "
                f"{device.memory_bytes / GB:.0f} GB per GPU before activations."
            )
    parts = {
        "Newton-Schulz": dual.ns_seconds,
        "all-to-all exchange": dual.exchange_seconds,
        "elementwise work": dual.elementwise_seconds,
    }
    ranked = sorted(parts.items(), key=lambda item: -item[1])
    shares = ", ".join(f"{name} {seconds / dual.serial:.0%}" for name, seconds in ranked)
    lines += [
        *_alternatives(result),
        "",
        f"Against the published Muon steps for the 1T model, {ANNOUNCED_STEP_S:g} s "
        f"(announcement) and {MEGATRON_STEP_S * 1e3:.0f} ms (Megatron-LM): the dual mesh "
        f"predicts {dual.overlapped:.3f} s with overlap ({dual.overlapped / ANNOUNCED_STEP_S:.2f}x "
        f"and {dual.overlapped / MEGATRON_STEP_S:.2f}x).",
        f"Where the time goes (dual mesh, busiest rank, no overlap): {shares}.",
        "",
        *_figures(result),
    ]
    return "\n".join(lines)
