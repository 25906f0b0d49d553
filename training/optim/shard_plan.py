"""Where every element of a sharded parameter goes for sharded Muon (computed once).

FSDP2 shards a parameter along dim 0 with ``torch.chunk`` semantics: rank q of a group of
W holds rows ``[q*c, (q+1)*c)`` clipped to the tensor, ``c = ceil(rows / W)`` (so late
ranks may hold fewer rows or none). Row-major flattening makes each shard a contiguous
range of flat indices, so applying a parameter's matrix layout to ``arange(numel)`` tells,
for every element of every matrix, which rank holds it and where in that rank's shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from training.optim.matrix_layout import MatrixLayout
from training.optim.newton_schulz import flops


@dataclass
class GroupPlan:
    """Index tensors for one (process group, matrix shape) group, from this rank's side."""

    group: dist.ProcessGroup
    world: int
    rank: int
    matrix_shape: tuple[int, int]
    members: list[int]  # indices of the parameters in this group
    member_sizes: list[int]  # their local shard sizes (numel)
    send_index: Tensor  # into the concatenated local shards, ordered by owner rank
    send_splits: list[int]
    recv_index: Tensor  # into this rank's owned matrices (flat), ordered by source rank
    recv_splits: list[int]
    owned: int  # how many matrices this rank orthogonalises
    total: int  # matrices in the group, over all ranks


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """[start, end) rows of ``rank`` under ``Shard(0)`` (torch.chunk semantics)."""
    chunk = -(-rows // world)
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


def _shard_dim(param: Tensor) -> int:
    placements = getattr(param, "placements", None)
    if placements is None:
        raise ValueError("sharded Muon needs DTensor parameters")
    shard_dims = [i for i, p in enumerate(placements) if p.is_shard()]
    if len(shard_dims) != 1 or placements[shard_dims[0]].dim != 0:  # type: ignore[attr-defined]
        raise ValueError(f"sharded Muon supports one Shard(0) placement, got {placements}")
    return shard_dims[0]


@dataclass
class _Member:
    index: int
    matrices: Tensor  # [count, m*n] flat element indices into the full parameter
    starts: list[int]  # flat start of each rank's shard
    base: int  # offset of this parameter in the concatenated local shards


def plan_groups(params: list[Tensor], layouts: list[MatrixLayout]) -> list[GroupPlan]:
    keyed: dict[tuple[int, int, int], list[int]] = {}
    for i, (param, layout) in enumerate(zip(params, layouts, strict=True)):
        dim = _shard_dim(param)
        group = param.device_mesh.get_group(dim)  # type: ignore[attr-defined]
        shape = layout.matrix_shape(tuple(param.shape))
        keyed.setdefault((id(group), *shape), []).append(i)
    # Newton-Schulz FLOPs each rank of a process group already owns, across groups, so that
    # small groups (fewer matrices than ranks) do not all land on the same low ranks.
    loads: dict[int, list[float]] = {}
    return [_plan(params, layouts, members, loads) for members in keyed.values()]


def _plan(
    params: list[Tensor],
    layouts: list[MatrixLayout],
    indices: list[int],
    loads: dict[int, list[float]],
) -> GroupPlan:
    first = params[indices[0]]
    dim = _shard_dim(first)
    mesh = first.device_mesh  # type: ignore[attr-defined]
    group, world, rank = mesh.get_group(dim), mesh.size(dim), mesh.get_local_rank(dim)
    m, n = layouts[indices[0]].matrix_shape(tuple(first.shape))
    members: list[_Member] = []
    sizes: list[int] = []
    base = 0
    for i in indices:
        param, layout = params[i], layouts[i]
        rows = param.shape[0]
        row_numel = param.numel() // max(rows, 1)
        starts = [shard_rows(rows, world, q)[0] * row_numel for q in range(world)]
        start, end = shard_rows(rows, world, rank)
        local = param.to_local()  # type: ignore[attr-defined]
        if local.shape[0] != end - start:
            raise ValueError(f"unexpected shard of {tuple(param.shape)}: {tuple(local.shape)}")
        flat = torch.arange(param.numel()).view(param.shape)
        members.append(_Member(i, layout.to_matrices(flat).reshape(-1, m * n), starts, base))
        sizes.append(local.numel())
        base += local.numel()

    index = torch.cat([mb.matrices for mb in members])  # [N, m*n]
    holder = torch.cat(
        [torch.bucketize(mb.matrices, torch.tensor(mb.starts[1:]), right=True) for mb in members]
    )
    local_pos = torch.cat([mb.matrices - mb.starts[rank] + mb.base for mb in members])
    load = loads.setdefault(id(group), [0.0] * world)
    owner = _assign_owners(holder, world, load, float(flops(m, n, 1)))

    order = torch.argsort(owner, stable=True)
    mine_mask = holder[order] == rank
    send_index = local_pos[order][mine_mask]
    send_splits = [int(mine_mask[owner[order] == o].sum()) for o in range(world)]

    mine = torch.nonzero(owner == rank).flatten()
    slots = torch.arange(len(mine) * m * n).view(len(mine), m * n)
    recv_parts, recv_splits = [], []
    for q in range(world):
        from_q = holder[mine] == q
        recv_parts.append(slots[from_q])
        recv_splits.append(int(from_q.sum()))
    device = first.to_local().device  # type: ignore[attr-defined]
    return GroupPlan(
        group=group,
        world=world,
        rank=rank,
        matrix_shape=(m, n),
        members=indices,
        member_sizes=sizes,
        send_index=send_index.to(device),
        send_splits=send_splits,
        recv_index=torch.cat(recv_parts).to(device),
        recv_splits=recv_splits,
        owned=len(mine),
        total=index.shape[0],
    )


def _assign_owners(holder: Tensor, world: int, load: list[float], cost: float) -> Tensor:
    """Balance Newton-Schulz work, then minimise bytes.

    Each rank owns at most ``ceil(N / world)`` matrices of the group. A matrix that one rank
    holds whole stays there while that rank has room (it then moves no bytes at all); every
    other matrix goes to the rank with the least work so far, counting earlier groups
    (``load``, updated in place), ties broken towards the rank holding most of it. The
    order is deterministic, so every rank computes the same owners.
    """
    count, size = holder.shape
    target = -(-count // world)
    held = torch.stack([(holder == q).sum(dim=1) for q in range(world)], dim=1).tolist()
    owner = [-1] * count
    owned = [0] * world
    for j in range(count):
        whole = [q for q in range(world) if held[j][q] == size]
        if whole and owned[whole[0]] < target:
            owner[j] = whole[0]
            owned[whole[0]] += 1
            load[whole[0]] += cost
    for j in range(count):
        if owner[j] < 0:
            rank = min(range(world), key=lambda q: (owned[q] >= target, load[q], -held[j][q], q))
            owner[j] = rank
            owned[rank] += 1
            load[rank] += cost
    return torch.tensor(owner, dtype=torch.long)
