"""Training with each Newton-Schulz precision and method: loss curves of the tiny model.

The tiny DeepSeek-V3 of the dev checkpoint (serving.tiny: hidden 128, 2 layers, MLA,
8 routed experts; byte vocabulary here) learns to predict the next byte of this
repository's own source (training/ and serving/, about 1 MB); held-out loss is measured on
gateway/ and billing/. Every variant trains from the same initialisation on the same
batches, per seed, with the trainer's defaults otherwise (Muon lr 0.02, AdamW 3e-4, grad
clip 1). Rows: held-out loss (mean over seeds, and the spread between seeds) at each
checkpoint, and the difference from float32 standard Newton-Schulz, seed by seed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/muon_precision.py --steps 400 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from serving.process import free_port
from serving.tiny import tiny_config
from training.components.data import TokenStream
from training.models.deepseek_v3.config import ModelConfig
from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "float32 standard": NewtonSchulzConfig(dtype="float32", method="standard"),
    "bfloat16 standard": NewtonSchulzConfig(dtype="bfloat16", method="standard"),
    "bfloat16 gram": NewtonSchulzConfig(dtype="bfloat16", method="gram"),
    "float16 gram (default)": NewtonSchulzConfig(dtype="float16", method="gram"),
}


def _bytes(folders: list[str]) -> torch.Tensor:
    data = b"".join(
        path.read_bytes() for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))
    )
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


@torch.no_grad()
def held_out_loss(
    trainer: Trainer, stream: TokenStream, batches: int, size: int, seq: int
) -> float:
    losses = []
    for index in range(batches):
        batch = stream.batch(index, size, seq)
        logits = trainer.model(batch["input_ids"])
        losses.append(F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten()))
    return float(torch.stack(losses).mean())


def run(args: argparse.Namespace) -> None:
    model = ModelConfig.from_hf_dict(tiny_config(256))
    train = TokenStream(_bytes(["training", "serving"]), 256, seed=0)
    held_out = TokenStream(_bytes(["gateway", "billing"]), 256, seed=12345)
    checkpoints = [s for s in range(0, args.steps + 1, args.every)]
    curves: dict[str, dict[int, list[float]]] = {}
    for name, ns in VARIANTS.items():
        curves[name] = {step: [] for step in checkpoints}
        for seed in args.seeds:
            train.seed = seed
            config = TrainerConfig(
                model=model, batch_size=args.batch, seq_len=args.seq, steps=args.steps,
                seed=seed, optimizer=dataclasses.replace(MuonConfig(), newton_schulz=ns),
            )  # fmt: skip
            trainer = Trainer(config)
            for step in range(args.steps + 1):
                if step in curves[name]:
                    loss = held_out_loss(trainer, held_out, args.eval_batches, args.batch, args.seq)
                    curves[name][step].append(loss)
                if step < args.steps:
                    trainer.train_step(train.batch(step, args.batch, args.seq))
            losses = " ".join(f"{curves[name][s][-1]:.3f}" for s in checkpoints)
            print(f"{name}, seed {seed}: held-out loss {losses}", flush=True)
    _report(curves, checkpoints, args)


def _report(curves: dict[str, dict[int, list[float]]], checkpoints: list[int],
            args: argparse.Namespace) -> None:  # fmt: skip
    print(f"\nheld-out loss (nats/byte), mean over seeds {args.seeds} (spread: max - min)")
    print(f"{'variant':<26}" + "".join(f"{f'step {s}':>18}" for s in checkpoints))
    for name, curve in curves.items():
        cells = [f"{statistics.mean(v):.4f} ({max(v) - min(v):.4f})" for v in curve.values()]
        print(f"{name:<26}" + "".join(f"{c:>18}" for c in cells))
    base = curves["float32 standard"]
    print("\ndifference from float32 standard, seed by seed (mean, and min..max over seeds)")
    print(f"{'variant':<26}" + "".join(f"{f'step {s}':>26}" for s in checkpoints[1:]))
    for name, curve in curves.items():
        if name == "float32 standard":
            continue
        cells = []
        for step in checkpoints:
            diffs = [a - b for a, b in zip(curve[step], base[step], strict=True)]
            cells.append(f"{statistics.mean(diffs):+.4f} ({min(diffs):+.3f}..{max(diffs):+.3f})")
        print(f"{name:<26}" + "".join(f"{c:>26}" for c in cells[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=100, help="held-out loss every N steps")
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--eval-batches", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        run(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
