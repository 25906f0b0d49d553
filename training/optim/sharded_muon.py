"""Muon on FSDP2-sharded (DTensor, ``Shard(0)``) parameters without gathering them.

Newton-Schulz needs whole matrices, FSDP2 holds row shards. For every group of
same-shape matrices (one process group, one shape) each matrix gets an owner rank
(preferring a rank that already holds all of it, else the least-loaded one, so each rank
owns about 1/world of the work). One ``all_to_all_single`` sends every shard's pieces to
the owners, the owners run one batched Newton-Schulz call, and a second
``all_to_all_single`` returns each piece to the rank it came from. Nothing is sent twice
and nothing is gathered everywhere. Which element goes where is worked out once, from the
global shapes and the ``Shard(0)`` chunking rule, as index tensors (training.optim.shard_plan).

Transfers are asynchronous: the runtime keeps up to ``max_in_flight`` groups' exchanges
posted while it runs Newton-Schulz for an earlier group, so communication hides behind
compute. Every rank posts collectives in the same order, which the fixed group order
guarantees.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from training.optim.config import MuonConfig
from training.optim.matrix_layout import MatrixLayout
from training.optim.newton_schulz import flops, orthogonalize
from training.optim.shard_plan import GroupPlan, plan_groups


@dataclass
class ExchangeStats:
    """What one step moved and computed on this rank (for benchmarks and metrics)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    newton_schulz_flops: int = 0
    matrices: int = 0


@dataclass
class _Task:
    plan: GroupPlan
    local_flat: Tensor
    received: Tensor | None = None
    returned: Tensor | None = None
    # The buffer being sent, kept alive until the asynchronous exchange completes.
    sending: Tensor | None = None
    work: Any = None


class ShardedOrthogonalizer:
    def __init__(
        self, params: list[Tensor], layouts: list[MatrixLayout], config: MuonConfig
    ) -> None:
        self.param_ids = [id(p) for p in params]
        self.config = config
        # max_in_flight 0: every exchange waits at once (the no-overlap baseline).
        self.overlap = config.max_in_flight > 0
        self.plans = plan_groups(params, layouts)
        self.stats = ExchangeStats()

    def run(self, updates: list[Tensor]) -> list[Tensor]:
        """Local update shards in, local orthogonalised shards out (same order)."""
        self.stats = ExchangeStats()
        results: dict[int, Tensor] = {}
        in_flight = self.config.max_in_flight
        gathering: deque[_Task] = deque()
        returning: deque[_Task] = deque()
        for plan in self.plans:
            task = _Task(plan, torch.cat([updates[i].reshape(-1).float() for i in plan.members]))
            self._start_gather(task)
            gathering.append(task)
            while len(gathering) > in_flight:
                returning.append(self._compute(gathering.popleft()))
                while len(returning) > in_flight:
                    self._finish(returning.popleft(), updates, results)
        while gathering:
            returning.append(self._compute(gathering.popleft()))
        while returning:
            self._finish(returning.popleft(), updates, results)
        return [results[i] for i in range(len(updates))]

    def _post(
        self,
        out: Tensor,
        send: Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: dist.ProcessGroup,
    ) -> Any:
        work = dist.all_to_all_single(
            out, send, out_splits, in_splits, group=group, async_op=self.overlap
        )
        rank = dist.get_rank(group)
        elem = send.element_size()
        self.stats.bytes_sent += (sum(in_splits) - in_splits[rank]) * elem
        self.stats.bytes_received += (sum(out_splits) - out_splits[rank]) * elem
        return work

    def _start_gather(self, task: _Task) -> None:
        plan = task.plan
        task.sending = task.local_flat[plan.send_index]
        task.received = task.sending.new_empty(sum(plan.recv_splits))
        task.work = self._post(
            task.received, task.sending, plan.recv_splits, plan.send_splits, plan.group
        )

    def _compute(self, task: _Task) -> _Task:
        plan = task.plan
        if task.work is not None:
            task.work.wait()
        m, n = plan.matrix_shape
        assert task.received is not None
        mats = task.received.new_zeros(plan.owned * m * n)
        mats.index_copy_(0, plan.recv_index, task.received)
        if plan.owned:
            mats = orthogonalize(mats.view(plan.owned, m, n), self.config.newton_schulz).reshape(-1)
            self.stats.newton_schulz_flops += plan.owned * flops(
                m, n, self.config.newton_schulz.steps
            )
            self.stats.matrices += plan.owned
        task.sending = mats[plan.recv_index]
        task.returned = task.sending.new_empty(sum(plan.send_splits))
        task.work = self._post(
            task.returned, task.sending, plan.send_splits, plan.recv_splits, plan.group
        )
        return task

    def _finish(self, task: _Task, updates: list[Tensor], results: dict[int, Tensor]) -> None:
        plan = task.plan
        if task.work is not None:
            task.work.wait()
        assert task.returned is not None
        out = torch.empty_like(task.local_flat)
        out.index_copy_(0, plan.send_index, task.returned)
        for i, part in zip(plan.members, out.split(plan.member_sizes), strict=True):
            results[i] = part.view_as(updates[i])
