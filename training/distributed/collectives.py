"""Differentiable collectives that work on both gloo (CPU) and NCCL.

``torch.distributed.nn`` routes some backward passes through the list ``all_to_all``,
which gloo lacks (torch 2.13: ``all_to_all_single`` works on gloo, the list form does
not), so the two collectives the model needs are written here on
top of ``all_gather`` and ``all_to_all_single`` only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor


def all_to_all_single(
    tensor: Tensor,
    output_splits: list[int],
    input_splits: list[int],
    group: dist.ProcessGroup,
) -> Tensor:
    """Exchange rows of ``tensor`` (dim 0); the backward pass sends gradients back."""
    return _AllToAllSingle.apply(tensor, output_splits, input_splits, group)  # type: ignore[no-any-return]


def all_gather_dim0(tensor: Tensor, group: dist.ProcessGroup) -> Tensor:
    """Concatenate every rank's ``tensor`` along dim 0 (equal sizes); backward sums."""
    return _AllGatherDim0.apply(tensor, group)  # type: ignore[no-any-return]


def exchange(
    tensor: Tensor, output_splits: list[int], input_splits: list[int], group: dist.ProcessGroup
) -> Tensor:
    """Non-differentiable ``all_to_all_single`` along dim 0."""
    out = tensor.new_empty((sum(output_splits), *tensor.shape[1:]))
    dist.all_to_all_single(out, tensor.contiguous(), output_splits, input_splits, group=group)
    return out


class _AllToAllSingle(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        tensor: Tensor,
        output_splits: list[int],
        input_splits: list[int],
        group: dist.ProcessGroup,
    ) -> Tensor:
        ctx.splits = (output_splits, input_splits)
        ctx.group = group
        return exchange(tensor, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        output_splits, input_splits = ctx.splits
        return exchange(grad, input_splits, output_splits, ctx.group), None, None, None


class _AllGatherDim0(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: dist.ProcessGroup) -> Tensor:  # type: ignore[override]
        ctx.group = group
        world = dist.get_world_size(group)
        parts = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        # Every rank holds a gradient for every rank's rows: send each slice to its owner
        # and sum what arrives (a reduce-scatter built from all_to_all_single).
        world = dist.get_world_size(ctx.group)
        rows = grad.shape[0] // world
        received = exchange(grad, [rows] * world, [rows] * world, ctx.group)
        return received.view(world, rows, *grad.shape[1:]).sum(dim=0), None
