"""Sharded Muon (all-to-all to owner ranks) equals full-matrix Muon, uneven shards included."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from spawn import run_ranks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from training.optim.config import MuonConfig
from training.optim.matrix_layout import WHOLE, MatrixLayout, Split
from training.optim.muon import Muon
from training.optim.sharded_muon import ShardedOrthogonalizer

# Shapes chosen to shard unevenly on 2, 4 and 8 ranks, leave some ranks empty, split
# matrices across ranks, and put two parameters in one same-shape group.
SHAPES: list[tuple[tuple[int, ...], MatrixLayout]] = [
    ((12, 15), MatrixLayout(Split.COL_BLOCKS, 3)),  # per-head [12, 5], every rank holds rows
    ((21, 6), MatrixLayout(Split.ROW_BLOCKS, 3)),  # per-head [7, 6], heads cross shard edges
    ((14, 6), MatrixLayout(Split.ROW_BLOCKS, 2)),  # same [7, 6] group as above
    ((5, 4, 6), MatrixLayout(Split.STACKED)),  # 5 experts: ranks 5..7 of 8 hold none
    ((10, 9), WHOLE),
    ((3, 4), WHOLE),  # fewer rows than ranks
]


def _tensors(seed: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(shape, generator=gen) for shape, _ in SHAPES]
    grads = [[torch.randn(shape, generator=gen) for shape, _ in SHAPES] for _ in range(2)]
    return weights, grads


def _reference(config: MuonConfig) -> list[torch.Tensor]:
    weights, grads = _tensors(0)
    params = [nn.Parameter(w.clone()) for w in weights]
    layouts = {p: layout for p, (_, layout) in zip(params, SHAPES, strict=True)}
    opt = Muon([{"params": params, "use_muon": True}], layouts, config)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params]


def _check(rank: int, shard_ranks: int, world: int, config: MuonConfig) -> None:
    """Shard over groups of ``shard_ranks`` (the mesh's inner dim), replicate over the rest,
    as HSDP lays out dense weights."""
    mesh = init_device_mesh("cpu", (world // shard_ranks, shard_ranks))
    placements = [Replicate(), Shard(0)]
    weights, grads = _tensors(0)
    params = [nn.Parameter(distribute_tensor(w.clone(), mesh, placements)) for w in weights]
    layouts = {p: layout for p, (_, layout) in zip(params, SHAPES, strict=True)}
    opt = Muon([{"params": params, "use_muon": True}], layouts, config)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = distribute_tensor(g.clone(), mesh, placements)
        opt.step()
    expected = _reference(config)
    for p, ref, w in zip(params, expected, weights, strict=True):
        full = p.detach().full_tensor()
        tolerance = 1e-6 * (ref - w).norm().item()
        diff = (full - ref).abs().max().item()
        assert diff <= tolerance, (
            f"{shard_ranks} ranks, rank {rank}, shape {tuple(ref.shape)}: {diff} > {tolerance}"
        )


def _trace_schedule() -> list[tuple[str, tuple[int, int]]]:
    """Record the runtime's order of events (gather posted, Newton-Schulz run, finished)."""
    events: list[tuple[str, tuple[int, int]]] = []
    for name in ("_start_gather", "_compute", "_finish"):
        original = getattr(ShardedOrthogonalizer, name)

        def traced(self: ShardedOrthogonalizer, task: Any, *rest: Any, _n=name, _o=original) -> Any:
            events.append((_n, task.plan.matrix_shape))
            return _o(self, task, *rest)

        setattr(ShardedOrthogonalizer, name, traced)
    return events


def _worker(rank: int, world: int) -> None:
    events = _trace_schedule()
    overlapped = MuonConfig(lr=1.0, weight_decay=0.1, max_in_flight=2)
    for shard_ranks in (2, 4, 8):
        _check(rank, shard_ranks, world, overlapped)
    # Overlap: the next groups' gathers are posted before the first group's Newton-Schulz,
    # and never more than max_in_flight of them are waiting.
    first_step = events[: 3 * 5]  # 5 same-shape groups in SHAPES
    kinds = [kind for kind, _ in first_step]
    assert kinds[:4] == ["_start_gather", "_start_gather", "_start_gather", "_compute"], kinds
    events.clear()
    _check(rank, 4, world, MuonConfig(lr=1.0, weight_decay=0.1, max_in_flight=0))
    kinds = [kind for kind, _ in events[:3]]
    assert kinds == ["_start_gather", "_compute", "_finish"], kinds


@pytest.mark.distributed
def test_sharded_muon_equals_full_matrix_muon_on_2_4_8_ranks() -> None:
    """One 8-process run: shard groups of 2, 4 and 8, with and without overlap."""
    run_ranks(_worker, 8)
