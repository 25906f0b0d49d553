"""A single-rank gloo process group: the trainer core runs under torch.distributed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from serving.process import free_port


@pytest.fixture
def process_group() -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
