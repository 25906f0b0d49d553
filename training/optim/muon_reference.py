"""Muon written as plainly as possible: the oracle the optimizer is tested against.

One matrix at a time, in float64, with the textbook quintic iteration on the matrix itself
(no batching, no Gram matrix, no half precision, no sharding), and each head's or
expert's matrix cut out of its tensor by explicit slicing rather than by
training.optim.matrix_layout's views. Tests and benchmarks only; the optimizer is
training.optim.muon.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.optim.matrix_layout import MatrixLayout, Split


def newton_schulz_reference(matrix: Tensor, config: NewtonSchulzConfig) -> Tensor:
    """The polar-factor approximation of one 2-D ``matrix`` (float32 out)."""
    x = matrix.double()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.norm(x) * config.norm_safety + config.eps)
    for a, b, c in config.coefficients():
        gram = x @ x.T
        x = a * x + b * (gram @ x) + c * (gram @ (gram @ x))
    return (x.T if tall else x).float()


def matrix_slices(layout: MatrixLayout, shape: tuple[int, ...]) -> list[tuple[slice | int, ...]]:
    """Index of every Muon matrix of a tensor of ``shape`` (rows/columns per head, experts)."""
    if layout.split is Split.STACKED:
        return [(e,) for e in range(shape[0])]
    if layout.split is Split.ROW_BLOCKS:
        rows = shape[0] // layout.blocks
        return [(slice(h * rows, (h + 1) * rows), slice(None)) for h in range(layout.blocks)]
    if layout.split is Split.COL_BLOCKS:
        cols = shape[1] // layout.blocks
        return [(slice(None), slice(h * cols, (h + 1) * cols)) for h in range(layout.blocks)]
    return [(slice(None), slice(None))]


class MuonReference:
    """Nesterov momentum, per-matrix orthogonalisation, decoupled weight decay."""

    def __init__(
        self, params: Sequence[Tensor], layouts: Sequence[MatrixLayout], config: MuonConfig
    ) -> None:
        self.params, self.layouts, self.config = params, layouts, config
        self.momentum = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        cfg = self.config
        for param, layout, buf in zip(self.params, self.layouts, self.momentum, strict=True):
            assert param.grad is not None
            grad = param.grad
            buf.mul_(cfg.momentum).add_(grad, alpha=1 - cfg.momentum)
            update = grad * (1 - cfg.momentum) + buf * cfg.momentum if cfg.nesterov else buf
            param.mul_(1 - cfg.lr * cfg.weight_decay)
            for index in matrix_slices(layout, tuple(param.shape)):
                block = update[index]
                rows, cols = block.shape
                if cfg.scale_rule == "spectral":
                    scale = max(1.0, rows / cols) ** 0.5
                else:
                    scale = 0.2 * max(rows, cols) ** 0.5
                ortho = newton_schulz_reference(block, cfg.newton_schulz)
                param[index] -= cfg.lr * scale * ortho
