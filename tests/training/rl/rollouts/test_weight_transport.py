"""The streamed weight push's transport (training/rl/rollouts/weight_transport.py) without an
engine: how tensors are planned into buckets, the manifest a worker accepts, and a real
gloo group between this process (rank 0) and two receiving processes that get every
tensor back bit for bit, whatever its dtype and however the buckets split them."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch

from training.rl.rollouts.weight_transport import (
    ALIGN,
    TensorSpec,
    bucket_size,
    listen_socket,
    open_group,
    plan_buckets,
    receive_buckets,
    send_buckets,
)

TENSORS = {
    "model.embed_tokens.weight": torch.randn(64, 16).bfloat16(),
    "model.layers.0.mlp.experts.0.down_proj.weight": torch.randn(3, 5),
    "model.layers.0.mlp.experts.0.down_proj.weight_scale": torch.arange(7, dtype=torch.int64),
    "model.layers.0.mlp.gate.weight": torch.randn(1000).to(torch.float8_e4m3fn),
    "lm_head.weight": torch.randn(2048),  # 8 KiB: alone in a 4 KiB bucket plan
    "model.norm.weight": torch.ones(16, dtype=torch.float16),
}


def test_buckets_hold_the_tensors_in_order_aligned_and_within_their_size() -> None:
    plan = plan_buckets(TENSORS, bucket_bytes=4096)
    specs = [spec for bucket in plan for spec in bucket]
    assert [spec.name for spec in specs] == sorted(TENSORS)
    assert all(spec.offset % ALIGN == 0 for spec in specs)
    for bucket in plan:
        assert len(bucket) == 1 or bucket_size(bucket) <= 4096
    (alone,) = [bucket for bucket in plan if bucket[0].name == "lm_head.weight"]
    assert len(alone) == 1 and bucket_size(alone) == 8192
    (everything,) = plan_buckets(TENSORS, bucket_bytes=2**30)  # one bucket holds them all
    assert [spec.name for spec in everything] == sorted(TENSORS)


@pytest.mark.parametrize(
    "manifest_entry",
    [
        ["w", "complex64", [2], 0],  # a dtype no bucket carries
        ["w", "float32", [2], 3],  # an offset that cannot be viewed as the dtype
        ["w", "float32", [-2], 0],
        ["w", "float32", [2]],  # not four fields
    ],
)
def test_a_worker_refuses_a_manifest_entry_it_cannot_place(manifest_entry: list[Any]) -> None:
    with pytest.raises(ValueError):
        TensorSpec.from_json(manifest_entry)


def as_sent(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """A tensor as plain values: its dtype, shape and bytes."""
    return (
        str(tensor.dtype),
        tuple(tensor.shape),
        tensor.contiguous().view(torch.uint8).numpy().tobytes(),
    )


def _receive(port: int, rank: int, manifest: list[list[Any]], results: Any) -> None:
    plan = [[TensorSpec.from_json(entry) for entry in bucket] for bucket in manifest]
    group = open_group("127.0.0.1", port, rank, 3, "test-token", timeout_s=60)
    # Plain bytes, not tensors: a tensor put on a multiprocessing queue travels as a file
    # descriptor this process shares until it exits, and it may exit before it is read.
    results.put({name: as_sent(tensor) for name, tensor in receive_buckets(group, plan)})


def test_every_rank_receives_every_tensor_bit_for_bit() -> None:
    plan = plan_buckets(TENSORS, bucket_bytes=4096)
    manifest = [[spec.as_json() for spec in bucket] for bucket in plan]
    listening = listen_socket("127.0.0.1")
    port = listening.getsockname()[1]
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    ranks = [spawn.Process(target=_receive, args=(port, r, manifest, results)) for r in (1, 2)]
    for process in ranks:
        process.start()
    try:
        group = open_group("127.0.0.1", port, 0, 3, "test-token", 60, listening)
        sent = send_buckets(group, TENSORS, plan)
        received = [results.get(timeout=120) for _ in ranks]
    finally:
        for process in ranks:
            process.join(timeout=60)
    assert sent == sum(bucket_size(bucket) for bucket in plan)
    for tensors in received:
        assert tensors.keys() == TENSORS.keys()
        for name, tensor in TENSORS.items():
            assert tensors[name] == as_sent(tensor), name
