"""Weights sent from the trainer to vLLM's workers in buckets, over a process group.

The disk path (weight_sync.VllmWeightSync.push) writes a full HF export and has every
engine read it back. This path sends the same tensors, the ones the export would write
(``hf_io.hf_tensors``), straight into the workers' memory: the trainer is rank 0 of a
process group that every worker of every engine joins for one push, and broadcasts the
tensors in buckets of about ``bucket_bytes``; each worker feeds them, as they arrive, to
vLLM's in-place ``reload_weights`` (vllm_extension.py). One broadcast reaches every
replica at once. The group is gloo over TCP here (CPU engines); on GPUs the same plan
goes over NCCL.

Only torch is imported: the vLLM workers import this module, and so does the trainer.

The group's rendezvous store listens on the trainer for the length of a push, on the
address the engines reach it at, and admits only the ranks that present the push's
random token (the store keys are prefixed with it). The port must be reachable from
the engines only, as their own endpoints are (the chart's NetworkPolicy).
"""

from __future__ import annotations

import math
import socket
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore
from torch.distributed.distributed_c10d import ProcessGroupGloo

#: Offsets inside a bucket are aligned so that every slice can be viewed as its dtype.
ALIGN = 64
#: The dtypes a bucket may carry, by name: a manifest naming another is refused.
DTYPES: dict[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                  torch.int32, torch.int8, torch.uint8, torch.int64)
}  # fmt: skip


@dataclass(frozen=True)
class TensorSpec:
    """One tensor's place in its bucket."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    def as_json(self) -> list[Any]:
        return [self.name, self.dtype, list(self.shape), self.offset]

    @classmethod
    def from_json(cls, value: Any) -> TensorSpec:
        name, dtype, shape, offset = value
        if dtype not in DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not one a bucket carries")
        spec = cls(str(name), dtype, tuple(int(d) for d in shape), int(offset))
        if spec.offset < 0 or spec.offset % ALIGN or any(d < 0 for d in spec.shape):
            raise ValueError(f"tensor {name!r}: bad offset or shape")
        return spec


Bucket = list[TensorSpec]


def bucket_size(bucket: Bucket) -> int:
    """Bytes of the buffer a bucket travels in."""
    return max((spec.offset + spec.nbytes for spec in bucket), default=0)


def plan_buckets(tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[Bucket]:
    """The tensors in name order, packed into buckets of at most ``bucket_bytes`` (a larger
    tensor travels alone)."""
    buckets: list[Bucket] = [[]]
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"{name}: {tensor.dtype} cannot be sent")
        nbytes = tensor.numel() * tensor.element_size()
        if buckets[-1] and offset + nbytes > bucket_bytes:
            buckets.append([])
            offset = 0
        buckets[-1].append(TensorSpec(name, dtype, tuple(tensor.shape), offset))
        offset += -(-nbytes // ALIGN) * ALIGN
    return [bucket for bucket in buckets if bucket]


def listen_socket(host: str) -> socket.socket:
    """A socket bound and listening on a free port of ``host``, for the rendezvous store
    (bound before the engines are told the port: no other process can take it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def open_group(
    host: str,
    port: int,
    rank: int,
    world_size: int,
    token: str,
    timeout_s: float,
    listening: socket.socket | None = None,
) -> ProcessGroupGloo:
    """Join the push's gloo group; rank 0 (the trainer) serves the store on ``listening``."""
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        assert listening is not None, "rank 0 serves the store on its listening socket"
        store = TCPStore(
            host, port, world_size, is_master=True, timeout=timeout,
            wait_for_workers=False, master_listen_fd=listening.detach(),
        )  # fmt: skip
    else:
        store = TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    prefixed = PrefixStore(f"cstack-weights/{token}/", store)
    return ProcessGroupGloo(prefixed, rank, world_size, timeout)


def _broadcast(group: ProcessGroupGloo, buffer: torch.Tensor) -> dist.Work:
    """Start broadcasting ``buffer`` from rank 0 (gloo runs it on its own thread)."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([buffer], options)  # type: ignore[attr-defined,no-any-return]


#: Buckets in flight at once: one travels while the next is packed (rank 0) or the last
#: one loads (the workers), so transfer and copying overlap.
IN_FLIGHT = 2


def send_buckets(
    group: ProcessGroupGloo, tensors: Mapping[str, torch.Tensor], plan: list[Bucket]
) -> int:
    """Rank 0: broadcast every bucket; returns the bytes sent (once, to every rank)."""
    sent = 0
    in_flight: deque[dist.Work] = deque()
    for bucket in plan:
        buffer = torch.empty(bucket_size(bucket), dtype=torch.uint8)
        for spec in bucket:
            source = tensors[spec.name].detach().cpu().contiguous().reshape(-1)
            buffer[spec.offset : spec.offset + spec.nbytes] = source.view(torch.uint8)
        if len(in_flight) == IN_FLIGHT:
            in_flight.popleft().wait()
        in_flight.append(_broadcast(group, buffer))
        sent += buffer.numel()
    for work in in_flight:
        work.wait()
    return sent


def receive_buckets(
    group: ProcessGroupGloo, plan: list[Bucket]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Ranks above 0: each tensor as its bucket arrives (views of the bucket's buffer,
    a new buffer per bucket: the consumer may hold on to them). The next buckets are
    already arriving while the consumer loads this one's tensors."""
    posted: deque[tuple[Bucket, torch.Tensor, dist.Work]] = deque()
    pending = iter(plan)

    def post() -> None:
        bucket = next(pending, None)
        if bucket is not None:
            buffer = torch.empty(bucket_size(bucket), dtype=torch.uint8)
            posted.append((bucket, buffer, _broadcast(group, buffer)))

    for _ in range(IN_FLIGHT):
        post()
    while posted:
        bucket, buffer, work = posted.popleft()
        work.wait()
        post()
        for spec in bucket:
            raw = buffer[spec.offset : spec.offset + spec.nbytes]
            yield spec.name, raw.view(DTYPES[spec.dtype]).reshape(spec.shape)
