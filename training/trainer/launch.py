"""Per-rank entry point under torchrun: ``python -m training.trainer.launch CONFIG.json``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer


def main(config_path: str) -> None:
    config = TrainerConfig.from_json(Path(config_path).read_text())
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend)
    try:
        Trainer(config).fit()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
