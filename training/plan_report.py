"""The text `cstack plan` prints: both layouts side by side, then the verdict against the
published Muon step times and where the time goes (training.plan computes the figures)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from training.plan import (
    ANNOUNCED_STEP_S,
    MEGATRON_STEP_S,
    Device,
    Estimate,
    Plan,
    PlanConfig,
    plan,
)

GB, TFLOP = 1e9, 1e12


def with_bf16_newton_schulz(estimate: Estimate, device: Device) -> Estimate:
    faster = device.newton_schulz_flops / device.newton_schulz_flops_bf16
    return dataclasses.replace(estimate, ns_seconds=estimate.ns_seconds * faster)


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
        ("Newton-Schulz per GPU per step (TFLOP, busiest rank)", [
            ("dense (per head / whole matrices)", lambda e: f"{e.ns_dense / TFLOP:.2f}"),
            ("routed experts (per expert)", lambda e: f"{e.ns_experts / TFLOP:.2f}"),
        ]),
        ("all-to-all per GPU per step (GB sent)", [
            ("sharded Muon exchange", lambda e: f"{e.muon_bytes / GB:.2f}"),
            (f"MoE tokens ({config.tokens_per_gpu} tokens/GPU)",
             lambda e: f"{e.token_bytes / GB:.2f}"),
        ]),
        ("Muon optimizer step (s)", [
            ("Newton-Schulz (fp32, as the code runs)", lambda e: f"{e.ns_seconds:.3f}"),
            ("exchange (all-to-all)", lambda e: f"{e.exchange_seconds:.3f}"),
            ("elementwise (momentum, AdamW, update)", lambda e: f"{e.elementwise_seconds:.3f}"),
            ("predicted, with overlap", lambda e: f"{e.overlapped:.3f}"),
            ("predicted, no overlap", lambda e: f"{e.serial:.3f}"),
            ("with bf16 Newton-Schulz, overlap",
             lambda e: f"{with_bf16_newton_schulz(e, device).overlapped:.3f}"),
        ]),
    ]  # fmt: skip
    lines = []
    for heading, rows in sections:
        if heading:
            lines.append(heading)
        for label, value in rows:
            lines.append(f"  {label:<38}" + "".join(f"{value(e):>18}" for e in result.estimates))
    return lines


def report(config: PlanConfig) -> str:
    result = plan(config)
    model, device = result.model, result.device
    total = sum(p.numel for p in result.params)
    experts = sum(p.numel for p in result.params if p.expert)
    lines = [
        f"cstack plan: {config.model}: {total / 1e9:,.1f}B parameters ({experts / 1e9:,.1f}B in "
        f"{model.n_routed_experts} routed experts x {model.num_hidden_layers} layers, "
        f"{(total - experts) / 1e9:,.1f}B dense); fp32 weights, gradients and optimizer state",
        f"cluster: {config.gpus} x {device.name} ({device.gpus_per_node} per node, "
        f"{device.memory_bytes / GB:.0f} GB, all-to-all "
        f"{device.intra_node_bandwidth / GB:.0f} GB/s in a node, "
        f"{device.inter_node_bandwidth / GB:.0f} GB/s across; "
        f"Newton-Schulz {device.newton_schulz_flops / TFLOP:.0f} TFLOP/s fp32)",
        f"figures: {' '.join(device.source.split())}",
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
    dual = result.estimates[0]
    parts = {
        "Newton-Schulz on experts": dual.ns_experts / device.newton_schulz_flops,
        "Newton-Schulz on dense matrices": dual.ns_dense / device.newton_schulz_flops,
        "all-to-all exchange": dual.exchange_seconds,
        "elementwise updates": dual.elementwise_seconds,
    }
    ranked = sorted(parts.items(), key=lambda item: -item[1])
    shares = ", ".join(f"{name} {seconds / dual.serial:.0%}" for name, seconds in ranked)
    bf16 = with_bf16_newton_schulz(dual, device).overlapped
    lines += [
        f"Against the published Muon steps for the 1T model, {ANNOUNCED_STEP_S:g} s "
        f"(announcement) and {MEGATRON_STEP_S * 1e3:.0f} ms (Megatron-LM): the dual mesh "
        f"predicts {dual.overlapped:.3f} s with overlap ({dual.overlapped / ANNOUNCED_STEP_S:.1f}x "
        f"and {dual.overlapped / MEGATRON_STEP_S:.1f}x), {bf16:.3f} s with Newton-Schulz in bf16.",
        f"Where the time goes (dual mesh, no overlap): {shares}.",
    ]
    return "\n".join(lines)
