"""Who orthogonalises which sharded Muon matrix, and which pieces travel where (computed once).

A parameter is placed on a mesh: ``ranks[g, k]`` is the job rank holding shard ``k`` (dim-0
rows, torch.chunk semantics) in replica ``g``; every rank of one replica together holds one
copy. A Muon matrix (training.optim.matrix_layout) then lies on each shard as one block of
its rows, possibly empty: the matrix's *piece* on that shard. Pieces are contiguous both in
the matrix (rows ``[start, end)``, row-major) and in the shard (``MatrixLayout.pieces_view``
orders a shard matrix by matrix), so every transfer is one slice.

Owners. With ``owners="job"`` every matrix is orthogonalised once in the job: its owner is
any rank; it gathers the pieces from its own replica (for the dense mesh, its own node),
returns each result piece to its shard in that replica, and from there each piece goes on
to the same shard of every other replica (``GroupPlan``'s three rounds). With
``"shard_group"`` each replica orthogonalises its own copy on its own ranks (the layout
before every rank was kept busy: replicas repeat each other's work). ``_assign_owners``
says how owners are chosen: Newton-Schulz FLOPs balanced to within two matrices of the
job's mean, and the bytes each rank passes on balanced too. Everything is a pure function
of the shapes and placements, so every rank computes the same plan, and ``cstack plan``
(training.plan.muon_step) calls the same code for a 1T model without any tensors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from training.optim.config import NewtonSchulzConfig, Owners
from training.optim.matrix_layout import MatrixLayout, Split
from training.optim.newton_schulz import flops


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """[start, end) rows of ``rank`` under ``Shard(0)`` (torch.chunk semantics)."""
    chunk = -(-rows // world)
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


@dataclass(frozen=True)
class Placement:
    """``ranks[g, k]``: the job rank holding shard ``k`` in replica ``g``."""

    ranks: np.ndarray

    @property
    def shards(self) -> int:
        return int(self.ranks.shape[1])

    def coordinates(self, world: int) -> tuple[np.ndarray, np.ndarray]:
        """Replica and shard of every job rank."""
        if sorted(self.ranks.flatten().tolist()) != list(range(world)):
            raise ValueError("sharded Muon needs every parameter's mesh to span all ranks")
        replica, shard = np.empty(world, dtype=np.int64), np.empty(world, dtype=np.int64)
        g, k = np.indices(self.ranks.shape)
        replica[self.ranks], shard[self.ranks] = g, k
        return replica, shard


@dataclass(frozen=True)
class ShardedMatrices:
    """One parameter as sharded Muon sees it."""

    shape: tuple[int, ...]
    layout: MatrixLayout
    placement: Placement

    def piece_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """[matrices, shards] start and end row of each matrix's piece on each shard."""
        m, _ = self.layout.matrix_shape(self.shape)
        rows, shards = self.shape[0], self.placement.shards
        first_row = np.minimum(np.arange(shards) * -(-rows // shards), rows)  # as shard_rows
        last_row = np.minimum(first_row + -(-rows // shards), rows)
        index = np.arange(self.layout.count(self.shape))[:, None]
        if self.layout.split is Split.STACKED:  # matrix j is row j of dim 0
            held = (first_row <= index) & (index < last_row)
            return np.zeros(held.shape, dtype=np.int64), np.where(held, m, 0)
        offset = index * m if self.layout.split is Split.ROW_BLOCKS else 0 * index
        start = np.clip(first_row - offset, 0, m)
        return start, np.maximum(np.clip(last_row - offset, 0, m), start)


@dataclass
class GroupPlan:
    """Every matrix of one shape, its owner, and all transfers, for the whole job.

    Copies are numbered member by member, matrix by matrix, replica by replica (one per
    matrix with job-wide owners). Transfers come in three rounds, each one all-to-all:
    ``gather`` (pieces to the owner, from the owner's replica), ``scatter`` (result pieces
    back to their shard in the owner's replica) and ``forward`` (with job-wide owners, from
    there to the same shard of every other replica: the other replicas' copies travel from
    all ranks of the owner's replica at once, not all from the owner). Rows are
    ``(copy, source rank, destination rank, start row, end row)``; a row whose source is its
    destination is a local copy.
    """

    matrix_shape: tuple[int, int]
    members: list[int]  # indices of the parameters, in the order given
    cost: float  # Newton-Schulz FLOPs per matrix
    copy_member: np.ndarray  # [copies] index into ``members``
    copy_matrix: np.ndarray  # [copies] matrix index within its parameter
    copy_replica: np.ndarray  # [copies] the replica it is for (0 with job-wide owners)
    owner: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    gather: np.ndarray = field(default_factory=lambda: np.empty((0, 5), dtype=np.int64))
    scatter: np.ndarray = field(default_factory=lambda: np.empty((0, 5), dtype=np.int64))
    forward: np.ndarray = field(default_factory=lambda: np.empty((0, 5), dtype=np.int64))

    @functools.cached_property
    def exchanges(self) -> bool:
        """Whether any piece moves between ranks (else no collective is posted)."""
        tables = (self.gather, self.scatter, self.forward)
        return any(bool((t[:, 1] != t[:, 2]).any()) for t in tables)

    @property
    def forwards(self) -> bool:
        """Whether the third round has anything to move."""
        return len(self.forward) > 0


def plan_groups(
    matrices: list[ShardedMatrices], world: int, owners: Owners, ns: NewtonSchulzConfig
) -> list[GroupPlan]:
    """One plan per matrix shape and placement, in order of first appearance. Parameters on
    different meshes (dense weights, experts) stay in separate groups, so a group of experts
    that never leave their rank posts no collective even when dense matrices of the same
    shape move."""
    by_shape: dict[tuple[tuple[int, int], tuple[int, ...], bytes], list[int]] = {}
    for index, item in enumerate(matrices):
        ranks = item.placement.ranks
        key = (item.layout.matrix_shape(item.shape), ranks.shape, ranks.tobytes())
        by_shape.setdefault(key, []).append(index)
    coords = [item.placement.coordinates(world) for item in matrices]
    rows = [item.piece_rows() for item in matrices]
    groups = []
    for (shape, _, _), members in by_shape.items():
        copies = [
            (i, j, c)
            for i, member in enumerate(members)
            for j in range(matrices[member].layout.count(matrices[member].shape))
            for c in range(1 if owners == "job" else len(matrices[member].placement.ranks))
        ]
        table = np.array(copies, dtype=np.int64).reshape(-1, 3)
        cost = float(flops(*shape, ns))
        groups.append(GroupPlan(shape, members, cost, table[:, 0], table[:, 1], table[:, 2]))
    _assign_owners(groups, matrices, coords, rows, world, owners)
    for group in groups:
        _transfers(group, matrices, coords, rows, owners)
    return groups


def _assign_owners(
    groups: list[GroupPlan],
    matrices: list[ShardedMatrices],
    coords: list[tuple[np.ndarray, np.ndarray]],
    rows: list[tuple[np.ndarray, np.ndarray]],
    world: int,
    owners: Owners,
) -> None:
    """Fill ``owner``, balancing two things: each rank's Newton-Schulz FLOPs, and the bytes
    each rank passes on to the other replicas (a piece of a copy leaves from its shard in
    the owner's replica, so what the owner's replica-mates send depends on the owner).

    A rank's projected load is what it owns so far plus the matrices still to place that
    only it holds whole, which it keeps unless that would take it past the fair share (the
    job's FLOPs over the world size); so a rank given a large matrix early sheds its own to
    others. Largest matrices go first. A matrix goes to a rank holding it whole while one
    stays under the fair share with it; else, among the ranks that stay under it (or, when
    none does, those within one matrix of the least load), to one that holds most of it,
    then sits nearest a holder (a shed expert stays in its node), then leaves the busiest
    sender of its replica least busy: many cheap but large matrices (o_proj's per-head
    [7168, 128]: 0.2% of an expert's FLOPs, half its elements) spread by bytes, not piled
    where FLOPs are lowest. No rank ends more than two matrices above the fair share.
    """
    whole: list[list[np.ndarray]] = []  # per group, per copy: candidate ranks holding it whole
    pending = np.zeros(world)
    for group in groups:
        m, _ = group.matrix_shape
        group.owner = np.full(len(group.copy_member), -1, dtype=np.int64)
        per_member = []
        for member in group.members:
            start, end = rows[member]
            matrix, shard = np.nonzero((end - start) == m)  # row-major: grouped by matrix
            full_k = np.split(shard, np.cumsum(np.bincount(matrix, minlength=len(start)))[:-1])
            per_member.append((matrices[member].placement.ranks, full_k))
        holders = []
        for i, j, c in zip(group.copy_member, group.copy_matrix, group.copy_replica, strict=True):
            ranks, full_k = per_member[i]
            found = ranks[:, full_k[j]].ravel() if owners == "job" else ranks[c, full_k[j]]
            holders.append(found)
            if len(found) == 1:
                pending[found[0]] += group.cost
        whole.append(holders)
    fair = sum(g.cost * len(g.copy_member) for g in groups) / world
    load = pending  # projected: owned + pending sole holdings
    passing = np.zeros(world)  # elements each rank will pass on to other replicas
    everyone = np.arange(world)
    for index in sorted(range(len(groups)), key=lambda g: -groups[g].cost):
        group = groups[index]
        cost, n = group.cost, group.matrix_shape[1]
        for copy, found in enumerate(whole[index]):
            if len(found) == 1:
                sole = int(found[0])
                load[sole] -= cost  # no longer pending; owned below
                if load[sole] + cost <= max(fair, cost):
                    # The common case (experts): a sole holder means one replica, so
                    # nothing is passed on whoever owns it, and this one moves nothing.
                    group.owner[copy] = sole
                    load[sole] += cost
                    continue
            member = group.members[group.copy_member[copy]]
            ranks, (replica, shard) = matrices[member].placement.ranks, coords[member]
            start, end = rows[member]
            j = group.copy_matrix[copy]
            pieces = (end[j] - start[j]) * n  # per shard
            forwarding = owners == "job" and len(ranks) > 1
            # Per replica: its busiest sender if it owned this copy.
            sender = (passing[ranks] + pieces).max(axis=1) if forwarding else np.zeros(len(ranks))
            roomy = found[load[found] + cost <= max(fair, cost)]
            if len(roomy):
                keys: tuple[np.ndarray, ...] = (roomy, load[roomy], sender[replica[roomy]])
                owner = int(roomy[np.lexsort(keys)[0]])
            else:
                pool = everyone if owners == "job" else ranks[group.copy_replica[copy]]
                under = pool[load[pool] + cost <= max(fair, cost)]
                pool = under if len(under) else pool[load[pool] <= load[pool].min() + cost]
                held = pieces[shard[pool]]
                keys = (pool, load[pool], sender[replica[pool]], _distance(pool, held), -held)
                owner = int(pool[np.lexsort(keys)[0]])
            group.owner[copy] = owner
            load[owner] += cost
            if forwarding:
                passing[ranks[replica[owner]]] += pieces * (len(ranks) - 1)


def _distance(pool: np.ndarray, held: np.ndarray) -> np.ndarray:
    """How far each rank of ``pool`` is from the nearest one holding a piece (0: holds one)."""
    holding = held > 0
    if holding.all() or not holding.any():
        return np.zeros_like(pool)
    holders = np.sort(pool[holding])
    at = np.searchsorted(holders, pool)
    left = holders[np.maximum(at - 1, 0)]
    right = holders[np.minimum(at, len(holders) - 1)]
    return np.minimum(np.abs(pool - left), np.abs(pool - right))


def _transfers(
    group: GroupPlan,
    matrices: list[ShardedMatrices],
    coords: list[tuple[np.ndarray, np.ndarray]],
    rows: list[tuple[np.ndarray, np.ndarray]],
    owners: Owners,
) -> None:
    """Every piece from the owner's replica to the owner; every result piece back to its
    shard in the owner's replica; with job-wide owners, from there to the same shard of
    every other replica."""
    gathers, scatters, forwards = [], [], []
    copy_ids = np.arange(len(group.copy_member))
    for i, member in enumerate(group.members):
        ranks = matrices[member].placement.ranks
        replica = coords[member][0]
        start, end = rows[member]
        mine = copy_ids[group.copy_member == i]
        matrix, owner = group.copy_matrix[mine], group.owner[mine]
        c, k = np.nonzero(end[matrix] > start[matrix])  # [copy, shard] pieces
        copy, first, last = mine[c], start[matrix[c], k], end[matrix[c], k]
        home = ranks[replica[owner[c]], k]  # the piece's shard in the owner's replica
        gathers.append(np.stack([copy, home, owner[c], first, last], axis=1))
        scatters.append(np.stack([copy, owner[c], home, first, last], axis=1))
        if owners == "job" and len(ranks) > 1:
            others = np.arange(len(ranks))
            c2, g = (a.ravel() for a in np.broadcast_arrays(np.arange(len(c))[:, None], others))
            away = g != replica[owner[c[c2]]]
            c2, g = c2[away], g[away]
            forwards.append(np.stack([copy[c2], home[c2], ranks[g, k[c2]], first[c2], last[c2]],
                                     axis=1))  # fmt: skip
    group.gather = np.concatenate(gathers).astype(np.int64)
    group.scatter = np.concatenate(scatters).astype(np.int64)
    if forwards:
        group.forward = np.concatenate(forwards).astype(np.int64)
