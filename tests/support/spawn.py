"""Run a function on N gloo ranks (torch.multiprocessing spawn), CPU only."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from serving.process import free_port


def _entry(
    rank: int, fn: Callable[..., None], world: int, port: int, args: tuple[Any, ...]
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` processes; any rank's error fails."""
    # A process group an earlier in-process test dropped may still await collection: freed
    # in a forked child, its destructor joins a gloo thread the child does not have, and
    # the rank hangs. Collect it here, where its threads exist.
    gc.collect()
    mp.start_processes(
        _entry, args=(fn, world, free_port(), args), nprocs=world, start_method="fork"
    )
