"""Muon on FSDP2-sharded (DTensor, ``Shard(0)``) parameters without gathering them.

Newton-Schulz needs whole matrices, FSDP2 holds row shards. training.optim.shard_plan gives
every matrix an owner (by default any rank of the job, so every rank gets about 1/world of
all Newton-Schulz work, experts and dense matrices alike) and lists every piece's
transfers. Per group of same-shape matrices on one mesh, one ``all_to_all_single`` over the
job sends the pieces (float32: the owner normalises before casting to the working
precision) from the owner's replica to the owner, the owner runs one batched Newton-Schulz
call, a second returns each result piece (in the working precision) to its shard in the
owner's replica, and with job-wide owners a third passes it on to the same shard of every
other replica, so that a large matrix's copies leave from all of its replica's ranks rather
than all from its owner. A group whose matrices all stay where they are (experts at EP =
world size) posts no collective. This rank's side of each round is worked out once, as
lists of piece indices (``_Round``).

Transfers are asynchronous: up to ``max_in_flight`` groups wait at each stage while the
rank runs Newton-Schulz for another group, and groups with nothing to exchange are
computed while the others' transfers fly. Every rank posts collectives in the same order,
which the fixed group order guarantees.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from training.optim.config import MuonConfig
from training.optim.matrix_layout import MatrixLayout
from training.optim.newton_schulz import DTYPES, orthogonalize
from training.optim.shard_plan import GroupPlan, Placement, ShardedMatrices, plan_groups


@dataclass
class ExchangeStats:
    """What one step moved and computed on this rank (for benchmarks and metrics)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    newton_schulz_flops: int = 0
    matrices: int = 0


def sharded_matrices(param: Tensor, layout: MatrixLayout) -> ShardedMatrices:
    """Where a DTensor's rows live: one ``Shard(0)`` mesh dimension, the others replicas."""
    placements = getattr(param, "placements", None)
    if placements is None:
        raise ValueError("sharded Muon needs DTensor parameters")
    shard_dims = [i for i, p in enumerate(placements) if p.is_shard()]
    others_replicate = all(p.is_replicate() or p.is_shard() for p in placements)
    if len(shard_dims) != 1 or placements[shard_dims[0]].dim != 0 or not others_replicate:
        raise ValueError(f"sharded Muon supports one Shard(0) placement, got {placements}")
    mesh = param.device_mesh  # type: ignore[attr-defined]
    dim = shard_dims[0]
    ranks = mesh.mesh.movedim(dim, -1).reshape(-1, mesh.size(dim)).cpu().numpy()
    return ShardedMatrices(tuple(param.shape), layout, Placement(ranks))


def _order(rows: np.ndarray, major: int) -> np.ndarray:
    """Rows sorted by column ``major`` (a rank), then by copy."""
    return rows[np.lexsort((rows[:, 0], rows[:, major]))]


@dataclass
class _Round:
    """One all-to-all from this rank's side."""

    send_order: list[int]  # indices into the round's source pieces, in send order
    send_splits: list[int]
    recv_splits: list[int]
    recv_sizes: list[int]  # sizes of the received pieces, in arrival order

    @classmethod
    def build(
        cls, rows: np.ndarray, rank: int, world: int, n: int, source: Callable[[Any], int]
    ) -> tuple[_Round, np.ndarray]:
        """The round of ``rows`` and the rows this rank receives, in arrival order; each
        source rank sends its pieces ordered by destination, then by copy."""
        sends = _order(rows[rows[:, 1] == rank], major=2)
        recvs = _order(rows[rows[:, 2] == rank], major=1)

        def splits(part: np.ndarray, column: int) -> list[int]:
            sizes = (part[:, 4] - part[:, 3]) * n
            return np.bincount(part[:, column], weights=sizes, minlength=world).astype(int).tolist()

        round_ = cls([source(row) for row in sends], splits(sends, 2), splits(recvs, 1),
                     ((recvs[:, 4] - recvs[:, 3]) * n).tolist())  # fmt: skip
        return round_, recvs


@dataclass
class _RankGroup:
    """One group from this rank's side: which pieces go out and come in, in which order."""

    plan: GroupPlan
    local_sizes: list[list[int]]  # per member: its local pieces' sizes, in shard order
    gather: _Round  # sources: local pieces (over members)
    assemble_order: list[int]  # gathered pieces, in owned-matrix order
    owned: int
    scatter: _Round  # sources: owned pieces (in owned-matrix order)
    forward: _Round  # sources: scattered pieces
    local_order: list[int]  # scattered then forwarded pieces, in local piece order

    @classmethod
    def build(
        cls, plan: GroupPlan, matrices: list[ShardedMatrices], world: int, rank: int
    ) -> _RankGroup:
        n = plan.matrix_shape[1]
        local: dict[tuple[int, int], int] = {}
        local_sizes = []
        for i, member in enumerate(plan.members):
            item = matrices[member]
            shard = int(item.placement.coordinates(world)[1][rank])
            start, end = item.piece_rows()
            held = np.flatnonzero(end[:, shard] > start[:, shard])
            local_sizes.append(((end[held, shard] - start[held, shard]) * n).tolist())
            local.update({(i, int(j)): len(local) + t for t, j in enumerate(held)})

        def key(copy: Any) -> tuple[int, int]:
            return int(plan.copy_member[copy]), int(plan.copy_matrix[copy])

        gather, gathered = _Round.build(plan.gather, rank, world, n, lambda r: local[key(r[0])])
        owned_pieces = np.lexsort((gathered[:, 3], gathered[:, 0]))  # by copy, then row
        owned_at = {(int(gathered[p, 0]), int(gathered[p, 3])): t
                    for t, p in enumerate(owned_pieces)}  # fmt: skip
        scatter, scattered = _Round.build(
            plan.scatter, rank, world, n, lambda r: owned_at[int(r[0]), int(r[3])]
        )
        scattered_at = {int(copy): t for t, copy in enumerate(scattered[:, 0])}
        forward, forwarded = _Round.build(
            plan.forward, rank, world, n, lambda r: scattered_at[int(r[0])]
        )
        results = [key(copy) for copy in (*scattered[:, 0], *forwarded[:, 0])]
        result_at = {k: t for t, k in enumerate(results)}
        if len(result_at) != len(results) or set(result_at) != set(local):
            raise AssertionError("sharded Muon plan: a local piece gets no single result")
        group = cls(
            plan=plan,
            local_sizes=local_sizes,
            gather=gather,
            assemble_order=owned_pieces.tolist(),
            owned=int((plan.owner == rank).sum()),
            scatter=scatter,
            forward=forward,
            local_order=[result_at[k] for k in sorted(local, key=local.__getitem__)],
        )
        if not plan.exchanges:  # every piece is a whole matrix its holder owns: no reordering
            identity = list(range(len(local)))
            orders = (gather.send_order, group.assemble_order, scatter.send_order)
            if any(order != identity for order in (*orders, group.local_order)):
                raise AssertionError("sharded Muon plan: a local group reorders its matrices")
        return group


@dataclass
class _Task:
    group: _RankGroup
    sending: Tensor  # kept alive until its asynchronous exchange completes
    received: Tensor
    work: Any = None
    scattered: Tensor | None = None  # kept for the results while the forward round flies


class ShardedOrthogonalizer:
    def __init__(
        self, params: list[Tensor], layouts: list[MatrixLayout], config: MuonConfig
    ) -> None:
        self.param_ids = [id(p) for p in params]
        self.layouts = layouts
        self.config = config
        # max_in_flight 0: every exchange waits at once (the no-overlap baseline).
        self.overlap = config.max_in_flight > 0
        world, rank = dist.get_world_size(), dist.get_rank()
        matrices = [sharded_matrices(p, layout) for p, layout in zip(params, layouts, strict=True)]
        plans = plan_groups(matrices, world, config.owners, config.newton_schulz)
        self.groups = [_RankGroup.build(plan, matrices, world, rank) for plan in plans]
        self.stats = ExchangeStats()

    def run(self, updates: list[Tensor]) -> list[Tensor]:
        """Local float32 update shards in; their orthogonalised values out, in the working
        precision, each shaped as its layout's ``pieces_view`` of the shard."""
        self.stats = ExchangeStats()
        results: dict[int, Tensor] = {}
        in_flight = self.config.max_in_flight
        quiet = deque(g for g in self.groups if not g.plan.exchanges)
        # Tasks wait in stage order: gather posted, scatter posted, forward posted.
        stages: list[deque[_Task]] = [deque(), deque(), deque()]
        steps: list[Callable[[_Task], _Task]] = [self._compute, self._forward]

        def advance(stage: int) -> None:
            task = stages[stage].popleft()
            if stage == len(steps):
                self._finish(task, updates, results)
                return
            stages[stage + 1].append(steps[stage](task))
            while len(stages[stage + 1]) > in_flight:
                advance(stage + 1)

        def run_quiet() -> None:
            task = self._compute(self._start_gather(quiet.popleft(), updates))
            self._finish(task, updates, results)

        for group in (g for g in self.groups if g.plan.exchanges):
            stages[0].append(self._start_gather(group, updates))
            while len(stages[0]) > in_flight:
                if quiet:  # work that needs no transfer, while this group's arrives
                    run_quiet()
                advance(0)
        while quiet:
            run_quiet()
        for stage in range(len(stages)):
            while stages[stage]:
                advance(stage)
        return [results[i] for i in range(len(updates))]

    def _post(self, sending: Tensor, round_: _Round) -> tuple[Tensor, Any]:
        received = sending.new_empty(sum(round_.recv_splits))
        work = dist.all_to_all_single(
            received, sending, round_.recv_splits, round_.send_splits, async_op=self.overlap
        )
        rank, elem = dist.get_rank(), sending.element_size()
        self.stats.bytes_sent += (sum(round_.send_splits) - round_.send_splits[rank]) * elem
        self.stats.bytes_received += (sum(round_.recv_splits) - round_.recv_splits[rank]) * elem
        return received, work

    def _start_gather(self, group: _RankGroup, updates: list[Tensor]) -> _Task:
        flats = [
            self.layouts[member].pieces_view(updates[member].float()).reshape(-1)
            for member in group.plan.members
        ]
        if not group.plan.exchanges:  # this rank's matrices, whole, already in owned order
            local = flats[0] if len(flats) == 1 else torch.cat(flats)
            return _Task(group, local, local)
        pieces = [
            p for flat, s in zip(flats, group.local_sizes, strict=True) for p in flat.split(s)
        ]
        sending = _cat([pieces[i] for i in group.gather.send_order], updates[0])
        received, work = self._post(sending, group.gather)
        return _Task(group, sending, received, work)

    def _compute(self, task: _Task) -> _Task:
        group = task.group
        if task.work is not None:
            task.work.wait()
        m, n = group.plan.matrix_shape
        ns = self.config.newton_schulz
        dtype = DTYPES[ns.dtype]
        if group.owned:
            self.stats.newton_schulz_flops += int(group.owned * group.plan.cost)
            self.stats.matrices += group.owned
        if not group.plan.exchanges:
            if group.owned:
                task.received = orthogonalize(task.received.view(-1, m, n), ns).reshape(-1)
            else:
                task.received = task.received.to(dtype)
            return task
        sending = task.received.new_empty(0, dtype=dtype)
        if group.owned:
            parts = task.received.split(group.gather.recv_sizes)
            matrices = torch.cat([parts[i] for i in group.assemble_order]).view(-1, m, n)
            results = orthogonalize(matrices, ns).reshape(-1)
            owned = results.split([group.gather.recv_sizes[i] for i in group.assemble_order])
            sending = _cat([owned[i] for i in group.scatter.send_order], sending)
        task.sending = sending
        task.received, task.work = self._post(sending, group.scatter)
        return task

    def _forward(self, task: _Task) -> _Task:
        """Once this replica's results are in, pass them to the other replicas."""
        group = task.group
        if task.work is not None:
            task.work.wait()
        task.scattered, task.work = task.received, None
        if group.plan.forwards:
            parts = task.received.split(group.scatter.recv_sizes)
            task.sending = _cat([parts[i] for i in group.forward.send_order], task.received)
            task.received, task.work = self._post(task.sending, group.forward)
        else:
            task.received = task.received[:0]
        return task

    def _finish(self, task: _Task, updates: list[Tensor], results: dict[int, Tensor]) -> None:
        group = task.group
        if task.work is not None:
            task.work.wait()
        local = task.received
        if group.plan.exchanges:
            assert task.scattered is not None
            parts = [
                *task.scattered.split(group.scatter.recv_sizes),
                *task.received.split(group.forward.recv_sizes),
            ]
            local = _cat([parts[i] for i in group.local_order], task.received)
        sizes = [sum(s) for s in group.local_sizes]
        for member, flat in zip(group.plan.members, local.split(sizes), strict=True):
            shape = self.layouts[member].pieces_view(updates[member]).shape
            results[member] = flat.view(shape)


def _cat(parts: list[Tensor], like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``torch.cat`` that also makes an empty result (no parts) of ``like``'s device."""
    if parts:
        return torch.cat(parts)
    return torch.empty(0, dtype=dtype or like.dtype, device=like.device)


@dataclass(frozen=True)
class GroupTraffic:
    """A rank's element counts for one group (``training.plan.plan`` reads them off the plan);
    each count an int, or a numpy array with one per rank."""

    local: Any  # elements of the members' shards on this rank
    column_blocks: Any  # of them, in column-block (transposed) layouts
    sourced: Any  # elements this rank sends to owners (its own included)
    owned: Any  # elements of the matrices it orthogonalises
    scattered: Any  # result elements it sends back (its own included)
    forwarded: Any  # result elements it passes on to other replicas
    members: int
    exchanges: bool


def memory_traffic(group: GroupTraffic, dtype: str, weight_decay: bool) -> Any:
    """Bytes of memory traffic one step makes for one group on one rank, pass by pass as
    training.optim.muon and this runtime make them (float32 state, results in ``dtype`` of
    ``h`` bytes): momentum and Nesterov (``lerp_`` and ``lerp``: 12 + 12 per local element);
    column blocks' transposing copy (8); the send copy (8 per sourced element) and the
    owner's assembly (8 per owned element), or for a group that stays put one concatenation
    of its members (8 per element, none for one member); normalisation per owned element
    (norm 4, divide 8, cast to half 4 + h); the results' copies out, on and back in (2h per
    scattered, forwarded and local element; none for a group that stays put); the update
    (weight 4 and result h read, weight 4 written; weight decay 8 more)."""
    h = DTYPES[dtype].itemsize
    total = 24 * group.local + 8 * group.column_blocks
    if group.exchanges:
        copied = group.scattered + group.forwarded + group.local
        total += 8 * group.sourced + 8 * group.owned + 2 * h * copied
    elif group.members > 1:
        total += 8 * group.local
    total += group.owned * (12 + (4 + h if h < 4 else 0))
    return total + group.local * (8 + h + (8 if weight_decay else 0))
