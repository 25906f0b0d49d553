"""Muon for the DeepSeek-V3 matrices, AdamW for everything else, in one optimizer.

Muon (Keller Jordan, 2024) keeps SGD momentum and replaces each matrix's update by its
orthogonalised version (training.optim.newton_schulz). Matrices are taken at the model's natural
granularity (training.optim.matrix_layout): per attention head for q/kv/o projections, per
expert for routed experts, whole otherwise. All matrices of one shape, across parameters,
go through a single batched Newton-Schulz call. Embeddings, the output head, norms,
biases and the router stay on AdamW, as in Moonlight and Kimi K2.

One optimizer object (rather than two) keeps checkpointing (DCP ``get_state_dict``),
learning-rate schedules and ``zero_grad`` simple for the trainer. Parameters that are
FSDP2 DTensors sharded on dim 0 are orthogonalised by training.optim.sharded_muon; the result is
the same as on the full matrices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from training.optim.config import MuonConfig, NewtonSchulzConfig, ScaleRule
from training.optim.matrix_layout import WHOLE, MatrixLayout, Split
from training.optim.newton_schulz import orthogonalize
from training.optim.sharded_muon import ExchangeStats, ShardedOrthogonalizer


def update_scale(rows: int, cols: int, rule: ScaleRule) -> float:
    if rule == "spectral":
        return max(1.0, rows / cols) ** 0.5
    if rule == "match_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"unknown Muon scale rule {rule!r} (spectral or match_adamw)")


def _adamw_name(name: str, param: Tensor) -> bool:
    return (
        param.dim() < 2
        or "embed_tokens" in name
        or name.startswith("lm_head")
        or name.endswith("mlp.gate.weight")  # the router: small, and sensitive to scale
    )


def matrix_layouts(model: nn.Module) -> tuple[dict[Tensor, MatrixLayout], list[Tensor]]:
    """Split the model's parameters into Muon matrices (with their layout) and AdamW ones."""
    heads = int(getattr(getattr(model, "config", None), "num_attention_heads", 1))
    muon: dict[Tensor, MatrixLayout] = {}
    adamw: list[Tensor] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if _adamw_name(name, param):
            adamw.append(param)
            continue
        if name.endswith(("q_proj.weight", "q_b_proj.weight", "kv_b_proj.weight")):
            layout = MatrixLayout(Split.ROW_BLOCKS, heads)
        elif name.endswith("o_proj.weight"):
            layout = MatrixLayout(Split.COL_BLOCKS, heads)
        elif param.dim() == 3:
            layout = MatrixLayout(Split.STACKED)
        else:
            layout = WHOLE
        layout.validate(name, tuple(param.shape))
        muon[param] = layout
    return muon, adamw


def _local(tensor: Tensor) -> Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def _is_sharded(param: Tensor) -> bool:
    placements = getattr(param, "placements", ())
    return any(p.is_shard() for p in placements)


class Muon(torch.optim.Optimizer):
    """Groups carry ``use_muon``; Muon groups need ``layouts`` given at construction."""

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        layouts: dict[Tensor, MatrixLayout],
        config: MuonConfig,
    ) -> None:
        defaults = {"lr": config.lr, "weight_decay": config.weight_decay, "use_muon": True}
        super().__init__(param_groups, defaults)
        self.config = config
        self.layouts = layouts
        self._sharded: Any = None  # training.optim.sharded_muon.ShardedOrthogonalizer, built lazily

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["use_muon"]:
                self._muon_step(params, group)
            else:
                self._adamw_step(params, group)

    def _momentum(self, param: Tensor) -> Tensor:
        cfg = self.config
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param)
        buf, grad = _local(state["momentum_buffer"]), _local(param.grad)  # type: ignore[arg-type]
        buf.lerp_(grad, 1 - cfg.momentum)
        return grad.lerp(buf, cfg.momentum) if cfg.nesterov else buf.clone()

    def _muon_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        updates = {p: self._momentum(p) for p in params}
        sharded = [p for p in params if _is_sharded(p)]
        local = [p for p in params if not _is_sharded(p)]
        results = orthogonalize_full(
            [(updates[p], self.layouts[p]) for p in local], self.config.newton_schulz
        )
        ortho = dict(zip(local, results, strict=True))
        if sharded:
            runner = self._sharded_orthogonalizer(sharded)
            ortho.update(zip(sharded, runner.run([updates[p] for p in sharded]), strict=True))
        lr, wd = group["lr"], group["weight_decay"]
        for p in params:
            layout = self.layouts[p]
            rows, cols = layout.matrix_shape(tuple(p.shape))
            scale = update_scale(rows, cols, self.config.scale_rule)
            data = _local(p)
            if wd:
                data.mul_(1 - lr * wd)
            # In place on the weight's matrix-ordered view: the half-precision result is
            # widened inside the add, with no float32 copy of it.
            layout.pieces_view(data).add_(ortho[p], alpha=-lr * scale)

    @property
    def exchange_stats(self) -> ExchangeStats:
        """What the last step's sharded Muon moved and computed on this rank."""
        return self._sharded.stats if self._sharded is not None else ExchangeStats()

    def _sharded_orthogonalizer(self, params: list[Tensor]) -> ShardedOrthogonalizer:
        if self._sharded is None or self._sharded.param_ids != [id(p) for p in params]:
            self._sharded = ShardedOrthogonalizer(
                params, [self.layouts[p] for p in params], self.config
            )
        return self._sharded

    # Memory traffic of _adamw_step per element (float32, no weight decay), pass by pass:
    # lerp_ 12, mul_ 8, addcmul_ 12, the denominator's divide, sqrt_ and add_ 8 each,
    # addcdiv_ 16. training.plan.plan turns it into time.
    ADAMW_BYTES_PER_ELEMENT = 72

    def _adamw_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        cfg = self.config
        beta1, beta2 = cfg.adamw_betas
        lr, wd = group["lr"], group["weight_decay"]
        for p in params:
            state = self.state[p]
            if "exp_avg" not in state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            step = float(state["step"])
            grad, data = _local(p.grad), _local(p)  # type: ignore[arg-type]
            exp_avg, exp_avg_sq = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(cfg.adamw_eps)
            if wd:
                data.mul_(1 - lr * wd)
            data.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))


def orthogonalize_full(
    items: Iterable[tuple[Tensor, MatrixLayout]], config: NewtonSchulzConfig
) -> list[Tensor]:
    """Orthogonalise whole tensors; one batched Newton-Schulz call per matrix shape. Each
    result is shaped as its layout's ``pieces_view`` of the tensor, in ``config.dtype``."""
    items = list(items)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for index, (tensor, layout) in enumerate(items):
        by_shape.setdefault(layout.matrix_shape(tuple(tensor.shape)), []).append(index)
    results: list[Tensor] = [torch.empty(0)] * len(items)
    for indices in by_shape.values():
        mats = [items[i][1].to_matrices(items[i][0]) for i in indices]
        ortho = orthogonalize(torch.cat(mats), config)
        for i, part in zip(indices, ortho.split([m.shape[0] for m in mats]), strict=True):
            tensor, layout = items[i]
            results[i] = part.view(layout.pieces_view(tensor).shape)
    return results


def build_optimizer(model: nn.Module, config: MuonConfig | None = None) -> Muon:
    """Muon on the model's matrices (per head / per expert), AdamW on the rest."""
    config = config or MuonConfig()
    layouts, adamw = matrix_layouts(model)
    groups: list[dict[str, Any]] = [
        {
            "params": list(layouts),
            "use_muon": True,
            "lr": config.lr,
            "weight_decay": config.weight_decay,
        },
        {
            "params": adamw,
            "use_muon": False,
            "lr": config.adamw_lr,
            "weight_decay": config.adamw_weight_decay,
        },
    ]
    return Muon([g for g in groups if g["params"]], layouts, config)
