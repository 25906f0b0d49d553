"""The Muon optimizer step `cstack plan` predicts, rank by rank.

Sharded Muon's owners and transfers come from training.optim.shard_plan, the code the
trainer runs, applied to the planned model's shapes and the layout's meshes (no tensors are
made), so each rank's Newton-Schulz work and all-to-all bytes are the trainer's. Time per
rank: Newton-Schulz FLOPs at the device's rate for the shape and precision (a measured
per-shape rate where the calibration has one); all-to-all bytes over the node's links or
the network, whichever takes longer (ranks ``r // gpus_per_node`` share a node); memory
traffic (``memory_traffic`` in training.optim.sharded_muon, ``ADAMW_BYTES_PER_ELEMENT`` in
training.optim.muon) at the memory bandwidth. The step is the slowest rank's.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from training.optim.config import MuonConfig, NewtonSchulzConfig, Owners
from training.optim.matrix_layout import MatrixLayout, Split
from training.optim.muon import Muon
from training.optim.newton_schulz import DTYPES, uses_gram
from training.optim.shard_plan import GroupPlan, Placement, ShardedMatrices, plan_groups
from training.optim.sharded_muon import GroupTraffic, memory_traffic
from training.plan.parts import Device, Layout, Param


@dataclass(frozen=True)
class MuonStep:
    """Per rank (arrays of the world size)."""

    ns_flops: np.ndarray
    ns_expert_flops: np.ndarray
    ns_seconds: np.ndarray
    sent_bytes: np.ndarray  # all-to-all bytes leaving the rank (its own pieces excluded)
    exchange_seconds: np.ndarray
    elementwise_seconds: np.ndarray
    buckets: int  # groups with an exchange, which the runtime pipelines

    @property
    def overlapped(self) -> np.ndarray:
        # Exchanges of later groups hide behind Newton-Schulz of earlier ones (and of groups
        # that exchange nothing); the first gather and the last return, about one group's
        # share, cannot.
        ns, exchange = self.ns_seconds, self.exchange_seconds
        exposed = np.minimum(ns, exchange) / max(self.buckets, 1)
        return np.maximum(ns, exchange) + exposed + self.elementwise_seconds

    @property
    def serial(self) -> np.ndarray:
        return self.ns_seconds + self.exchange_seconds + self.elementwise_seconds

    @property
    def busiest(self) -> int:
        return int(np.argmax(self.overlapped))


def _matrices(param: Param, layout: Layout) -> ShardedMatrices:
    split = Split(param.split)
    blocks = param.count if split in (Split.ROW_BLOCKS, Split.COL_BLOCKS) else 1
    shards = layout.ep if param.expert else layout.dense_group
    ranks = np.arange(layout.world).reshape(-1, shards)
    return ShardedMatrices(param.shape, MatrixLayout(split, blocks), Placement(ranks))


@functools.lru_cache(maxsize=4)
def _plan(
    chosen: tuple[Param, ...], layout: Layout, owners: Owners, ns: NewtonSchulzConfig
) -> list[GroupPlan]:
    matrices = [_matrices(p, layout) for p in chosen]
    return plan_groups(matrices, layout.world, owners, ns)


def muon_step(
    params: list[Param], layout: Layout, device: Device, muon: MuonConfig, adamw: np.ndarray
) -> MuonStep:
    """``adamw``: AdamW elements per rank."""
    world, ns = layout.world, muon.newton_schulz
    chosen = [p for p in params if p.muon]
    # Owners depend on each matrix's FLOPs, not on the precision: plan once per method.
    groups = _plan(tuple(chosen), layout, muon.owners, dataclasses.replace(ns, dtype="float32"))
    node = np.arange(world) // device.gpus_per_node
    flops_, expert_flops, seconds = np.zeros(world), np.zeros(world), np.zeros(world)
    # Bytes per rank: sent and received inside its node, sent and received across nodes.
    links = np.zeros((4, world))
    traffic = adamw * Muon.ADAMW_BYTES_PER_ELEMENT
    half = DTYPES[ns.dtype].itemsize
    for group in groups:
        m, n = group.matrix_shape
        owned = np.bincount(group.owner, minlength=world)
        rate = device.newton_schulz_rate(m, n, ns.dtype, uses_gram(m, n, ns))
        flops_ += owned * group.cost
        seconds += owned * group.cost / rate
        if chosen[group.members[0]].expert:
            expert_flops += owned * group.cost
        sent, received = {}, {}
        rounds = (("gather", group.gather, 4), ("scatter", group.scatter, half),
                  ("forward", group.forward, half))  # fmt: skip
        for name, rows, size in rounds:
            elements = (rows[:, 4] - rows[:, 3]) * n
            src, dst = rows[:, 1], rows[:, 2]
            sent[name] = np.bincount(src, weights=elements, minlength=world)
            received[name] = np.bincount(dst, weights=elements, minlength=world)
            moving = src != dst
            for link, keep in ((0, moving & (node[src] == node[dst])),
                               (2, moving & (node[src] != node[dst]))):  # fmt: skip
                for side, ranks in enumerate((src, dst)):
                    links[link + side] += size * np.bincount(
                        ranks[keep], weights=elements[keep], minlength=world
                    )
        column = np.zeros(world)
        for i, member in enumerate(group.members):
            if chosen[member].split == Split.COL_BLOCKS.value:
                for table in (group.scatter, group.forward):
                    rows = table[group.copy_member[table[:, 0]] == i]
                    column += np.bincount(rows[:, 2], weights=(rows[:, 4] - rows[:, 3]) * n,
                                          minlength=world)  # fmt: skip
        traffic += memory_traffic(
            GroupTraffic(
                local=received["scatter"] + received["forward"],
                column_blocks=column,
                sourced=sent["gather"],
                owned=received["gather"],
                scattered=sent["scatter"],
                forwarded=sent["forward"],
                members=len(group.members),
                exchanges=group.exchanges,
            ),
            ns.dtype,
            weight_decay=muon.weight_decay > 0,
        )
    exchange = np.maximum(
        links[:2].max(axis=0) / device.intra_node_bandwidth,
        links[2:].max(axis=0) / device.inter_node_bandwidth,
    )
    return MuonStep(
        ns_flops=flops_,
        ns_expert_flops=expert_flops,
        ns_seconds=seconds,
        sent_bytes=links[0] + links[2],
        exchange_seconds=exchange,
        elementwise_seconds=traffic / device.memory_bandwidth,
        buckets=sum(g.exchanges for g in groups),
    )
