"""What `cstack plan` computes over: a GPU type's throughputs (``Device``), the model's
parameters as the trainer holds them (``Param``) and the layouts compared (``Layout``).

Data only, so the plan's cost model (``training.plan.plan``) and its Muon step
(``training.plan.muon_step``) both build on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Device:
    """Throughputs of one GPU type; ``basis`` says per figure whether it was measured (and
    by which command) or assumed (and from what)."""

    name: str
    newton_schulz_flops: dict[str, float]  # per working precision, for any shape
    newton_schulz_shapes: dict[str, float]  # measured per shape (``shape_key``)
    memory_bandwidth: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    memory_bytes: float
    gpus_per_node: int
    basis: dict[str, str]
    sharded_step: dict[str, Any] | None = None  # a measured step, with what it was

    def newton_schulz_rate(self, rows: int, cols: int, dtype: str, gram: bool) -> float:
        return self.newton_schulz_shapes.get(
            shape_key(rows, cols, dtype, gram), self.newton_schulz_flops[dtype]
        )


def shape_key(rows: int, cols: int, dtype: str, gram: bool) -> str:
    """How a per-shape Newton-Schulz rate is named in the calibration file."""
    small, large = sorted((rows, cols))
    return f"{small}x{large} {dtype} {'gram' if gram else 'standard'}"


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


@dataclass(frozen=True)
class Layout:
    name: str
    world: int
    dense_group: int  # ranks each dense weight is sharded over
    ep: int
    cp: int
