"""Sharded Muon (all-to-all to owner ranks) equals full-matrix Muon on 2, 4 and 8 ranks,
with dense and expert weights on two different meshes (the trainer's dual mesh), uneven
shards included; with job-wide owners every rank gets its share of the work."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from tests.support.spawn import run_ranks
from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.optim.matrix_layout import WHOLE, MatrixLayout, Split
from training.optim.muon import Muon
from training.optim.muon_reference import MuonReference
from training.optim.newton_schulz import flops
from training.optim.sharded_muon import ShardedOrthogonalizer

# Shapes chosen to shard unevenly on 2, 4 and 8 ranks, leave some ranks empty, split
# matrices across ranks, and give both meshes matrices of one shape (separate groups).
SHAPES: list[tuple[tuple[int, ...], MatrixLayout]] = [
    ((12, 15), MatrixLayout(Split.COL_BLOCKS, 3)),  # per-head [12, 5], every rank holds rows
    ((21, 6), MatrixLayout(Split.ROW_BLOCKS, 3)),  # per-head [7, 6], heads cross shard edges
    ((14, 6), MatrixLayout(Split.ROW_BLOCKS, 2)),  # same [7, 6] group as above
    ((8, 7, 6), MatrixLayout(Split.STACKED)),  # experts (expert mesh), also [7, 6]
    ((5, 4, 6), MatrixLayout(Split.STACKED)),  # 5 experts: some EP ranks hold none
    ((10, 9), WHOLE),
    ((3, 4), WHOLE),  # fewer rows than ranks
]
FP32 = NewtonSchulzConfig(dtype="float32", method="standard")


def _tensors(seed: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(shape, generator=gen) for shape, _ in SHAPES]
    grads = [[torch.randn(shape, generator=gen) for shape, _ in SHAPES] for _ in range(2)]
    return weights, grads


def _full_matrix(config: MuonConfig, reference: bool) -> list[torch.Tensor]:
    """Two steps on whole tensors: the oracle (MuonReference) or Muon itself."""
    weights, grads = _tensors(0)
    params = [nn.Parameter(w.clone()) for w in weights]
    layouts = [layout for _, layout in SHAPES]
    opt: Any = (
        MuonReference(params, layouts, config)
        if reference
        else Muon(
            [{"params": params, "use_muon": True}], dict(zip(params, layouts, strict=True)), config
        )
    )
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params]


def _sharded(world: int, dense_shards: int, ep: int, config: MuonConfig) -> tuple[Muon, list]:
    """Dense weights sharded over groups of ``dense_shards`` and replicated over the rest
    (HSDP), experts over EP groups of ``ep`` (replicated over world / ep), as the trainer."""
    dense = init_device_mesh("cpu", (world // dense_shards, dense_shards))
    expert = init_device_mesh("cpu", (world // ep, ep))
    placements = [Replicate(), Shard(0)]
    weights, grads = _tensors(0)
    meshes = [expert if layout.split is Split.STACKED else dense for _, layout in SHAPES]
    params = [
        nn.Parameter(distribute_tensor(w.clone(), mesh, placements))
        for w, mesh in zip(weights, meshes, strict=True)
    ]
    layouts = {p: layout for p, (_, layout) in zip(params, SHAPES, strict=True)}
    opt = Muon([{"params": params, "use_muon": True}], layouts, config)
    for step_grads in grads:
        for p, g, mesh in zip(params, step_grads, meshes, strict=True):
            p.grad = distribute_tensor(g.clone(), mesh, placements)
        opt.step()
    return opt, [p.detach().full_tensor() for p in params]


def _assert_close(got: list, expected: list, tolerance: float, label: str) -> None:
    weights, _ = _tensors(0)
    for full, ref, w in zip(got, expected, weights, strict=True):
        # Relative to how far the two steps moved the weights.
        limit = tolerance * (ref - w).abs().max().item()
        diff = (full - ref).abs().max().item()
        assert diff <= limit, f"{label}, shape {tuple(ref.shape)}: {diff} > {limit}"


def _check_layouts(rank: int, world: int, layouts: list[tuple[int, int]]) -> None:
    for owners in ("job", "shard_group"):
        for dense_shards, ep in layouts:
            label = f"world {world}, dense {dense_shards}, EP {ep}, {owners}"
            fp32 = MuonConfig(lr=1.0, weight_decay=0.1, owners=owners, newton_schulz=FP32)  # type: ignore[arg-type]
            _, got = _sharded(world, dense_shards, ep, fp32)
            _assert_close(got, _full_matrix(fp32, reference=True), 1e-5, label)
            # The defaults (float16 Gram Newton-Schulz) against full-matrix Muon with them.
            default = dataclasses.replace(fp32, newton_schulz=NewtonSchulzConfig())
            opt, got = _sharded(world, dense_shards, ep, default)
            _assert_close(got, _full_matrix(default, reference=False), 1e-5, label)
            _check_balance(opt, world, dense_shards, ep)


def _check_balance(opt: Muon, world: int, dense_shards: int, ep: int) -> None:
    """Job-wide owners: each matrix orthogonalised once in the job, and no rank more than
    two matrices above total / world (shard_plan's bound). Shard-group owners: once per replica."""
    mine = torch.tensor([opt.exchange_stats.newton_schulz_flops], dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    work = torch.cat(every)
    ns, job = opt.config.newton_schulz, opt.config.owners == "job"
    total, largest = 0, 0
    for shape, layout in SHAPES:
        replicas = world // (ep if layout.split is Split.STACKED else dense_shards)
        cost = flops(*layout.matrix_shape(shape), ns)
        total += layout.count(shape) * cost * (1 if job else replicas)
        largest = max(largest, cost)
    assert work.sum().item() == total
    if job:
        assert work.max().item() <= total / world + 2 * largest, work.tolist()


def _worker_2(rank: int, world: int) -> None:
    _check_layouts(rank, world, [(2, 2), (1, 2)])


def _worker_4(rank: int, world: int) -> None:
    _check_layouts(rank, world, [(2, 4), (4, 2)])


@pytest.mark.distributed
@pytest.mark.parametrize(("world", "worker"), [(2, _worker_2), (4, _worker_4)])
def test_sharded_muon_equals_full_matrix_muon_on_2_and_4_ranks(world: int, worker: Any) -> None:
    run_ranks(worker, world)


def _trace_schedule() -> list[tuple[str, tuple[int, int], bool]]:
    """Record the runtime's order of events: gather posted, Newton-Schulz run and results
    sent, results passed on to the other replicas, finished."""
    events: list[tuple[str, tuple[int, int], bool]] = []
    for name in ("_start_gather", "_compute", "_forward", "_finish"):
        original = getattr(ShardedOrthogonalizer, name)

        def traced(self: ShardedOrthogonalizer, task: Any, *rest: Any, _n=name, _o=original) -> Any:
            plan = task.plan if hasattr(task, "plan") else task.group.plan
            events.append((_n, plan.matrix_shape, plan.exchanges))
            return _o(self, task, *rest)

        setattr(ShardedOrthogonalizer, name, traced)
    return events


def _worker_8(rank: int, world: int) -> None:
    events = _trace_schedule()
    # The trainer's layout on 8 ranks (CP=2 does not change the weights' meshes): dense
    # weights in shard groups of 2, experts on EP=8; then wide dense groups, narrow EP.
    _check_layouts(rank, world, [(2, 8), (8, 2)])
    events.clear()
    config = MuonConfig(lr=1.0, owners="job", max_in_flight=2, newton_schulz=FP32)
    _sharded(world, 2, 8, config)
    first_step = events[: len(events) // 2]
    exchanging = [e for e in first_step if e[2]]
    quiet = [e for e in first_step if not e[2]]
    # Overlap: the next groups' gathers are posted before the first group's Newton-Schulz,
    # and groups with nothing to exchange (experts at EP = world) run while they fly.
    assert [kind for kind, *_ in exchanging[:4]] == ["_start_gather"] * 3 + ["_compute"]
    assert quiet and first_step.index(quiet[1]) < first_step.index(exchanging[3])
    assert {kind for kind, *_ in quiet} == {"_start_gather", "_compute", "_finish"}
    events.clear()
    _sharded(world, 2, 8, dataclasses.replace(config, max_in_flight=0))
    exchanging = [kind for kind, _, exchanges in events if exchanges]
    stages = ["_start_gather", "_compute", "_forward", "_finish"]
    assert exchanging[:8] == stages * 2, exchanging


@pytest.mark.distributed
def test_sharded_muon_on_8_ranks_dual_mesh_and_overlap() -> None:
    run_ranks(_worker_8, 8)
