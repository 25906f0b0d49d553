"""Draft acceptance of the fast variant's MTP speculative decoding, before and after training.

One vLLM engine runs the fast variant with its speculative configuration (the MTP layer
drafts ``num_speculative_tokens`` tokens per step) on the CPU profile, with weight sync.
The script asks it for greedy completions of fixed prompts and reads the acceptance rate
from its own counters (serving/spec_decode.py: accepted over drafted tokens). Then the
trainer takes ``--steps`` steps on those completions (next-token cross entropy plus
DeepSeek-V3's MTP loss at ``--mtp-loss-weight``), exports, and the RL weight sync
(training/rl/rollouts/weight_sync.py) pushes the export into the running engine; the same
prompts are asked again. Rows:

- the base checkpoint;
- after the steps, pushed: the policy and its drafter as trained;
- with ``--restart``, a fresh engine on the export: equal counts show that the push
  reached the drafter;
- the trained MTP layer on the base model, pushed: the policy whose completions it was
  trained on, unchanged, so this shows what the MTP loss taught the drafter.

The tiny checkpoint is random. Its MTP layer starts out guessing, and a Muon step moves
every matrix of the random trunk by a full-size update, which changes most of its greedy
continuations; so the trained policy is a new one its drafter has not seen. The figures
show that MTP weights are trained, pushed and drafted with, not what a real model accepts.

    OMP_NUM_THREADS=1 .venv/bin/python bench/mtp_acceptance.py --out .cstack/mtp-bench --restart
"""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path

import redis
import torch
import torch.distributed as dist
from tokenizers import Tokenizer

from serving.engine import engine_for_variant
from serving.launcher import VllmServer
from serving.process import free_port
from serving.spec_decode import SpecDecodeCounters, greedy_counters
from serving.tiny import build_tiny_checkpoint
from serving.valkey import running_valkey
from training.components.checkpoint import graft_mtp_layers
from training.components.losses import IGNORE_INDEX
from training.optim.config import MuonConfig
from training.rl.rollouts.gate import PolicyVersionGate
from training.rl.rollouts.weight_sync import VllmWeightSync
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer

PROMPTS = [
    "def add(a, b):",
    "The quick brown fox",
    "Hello! How can I help you today?",
    "import os\nimport sys\n",
    "for i in range(10):",
    "Run the tests with pytest -q",
    "Once upon a time there was",
    "Error: file not found.",
]


def training_batch(prompts: list[list[int]], completions: list[list[int]]) -> dict:
    """Prompt + completion per row; the losses cover the completion tokens."""
    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    input_ids = torch.zeros(len(prompts), width, dtype=torch.long)
    labels = torch.full((len(prompts), width), IGNORE_INDEX, dtype=torch.long)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        tokens = prompt + completion
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, len(prompt) - 1 : len(tokens) - 1] = torch.tensor(completion)
    return {"input_ids": input_ids, "labels": labels}


def train(model: Path, batch: dict, args: argparse.Namespace, out: Path) -> list[float]:
    """``args.steps`` trainer steps on ``batch`` in a one-rank gloo group; exports to ``out``
    and returns the MTP loss of each step."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        rows, width = batch["input_ids"].shape
        trainer = Trainer(
            TrainerConfig(model_path=model, batch_size=rows, seq_len=width, log_every=0,
                          mtp_loss_weight=args.mtp_loss_weight,
                          optimizer=MuonConfig(lr=args.lr, adamw_lr=args.lr / 10))
        )  # fmt: skip
        losses = [trainer.train_step(batch).mtp_loss or 0.0 for _ in range(args.steps)]
        trainer.export(out)
        return losses
    finally:
        dist.destroy_process_group()


def row(label: str, counters: SpecDecodeCounters) -> str:
    positions = " / ".join(f"{p:.2f}" for p in counters.acceptance_per_position)
    line = (
        f"| {label} | {counters.accepted_tokens:.0f} / {counters.draft_tokens:.0f} | "
        f"{counters.acceptance_rate:.3f} | {positions} |"
    )
    print(line, flush=True)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path(".cstack/mtp-bench"))
    parser.add_argument("--model", type=Path, help="checkpoint (default: the seed-0 tiny one)")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--mtp-loss-weight", type=float, default=0.3)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--restart", action="store_true", help="check on a fresh engine")
    args = parser.parse_args()
    model = args.model or build_tiny_checkpoint(args.out / "tiny", seed=0)
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    prompts = [tokenizer.encode(text, add_special_tokens=False).ids for text in PROMPTS]
    trained = args.out / f"step-{args.steps}"
    steps = f"{args.steps} step(s)"

    def fast_engine(checkpoint: Path, log: str) -> VllmServer:
        return engine_for_variant("fast", checkpoint, free_port(), log_path=args.out / log,
                                  weight_sync=True, eager=True, speculative=True)  # fmt: skip

    rows = []
    with running_valkey() as redis_url:
        gate = PolicyVersionGate(redis.Redis.from_url(redis_url), f"mtp-{uuid.uuid4().hex}")
        engine = fast_engine(model, "vllm-fast.log")
        engine.start()
        try:
            engine.wait_healthy(timeout_s=900)
            sync = VllmWeightSync([engine.base_url], gate)
            before, completions = greedy_counters(engine.base_url, prompts, args.max_tokens)
            rows.append(row("base checkpoint", before))
            losses = train(model, training_batch(prompts, completions), args, trained)
            sync.push(trained)
            pushed, _ = greedy_counters(engine.base_url, prompts, args.max_tokens)
            rows.append(row(f"after {steps}, pushed", pushed))
            sync.push(graft_mtp_layers(model, trained, args.out / "base-with-trained-mtp"))
            drafter_only, _ = greedy_counters(engine.base_url, prompts, args.max_tokens)
        finally:
            engine.stop()
    if args.restart:
        fresh = fast_engine(trained, "vllm-fast-restart.log")
        fresh.start()
        try:
            fresh.wait_healthy(timeout_s=900)
            restarted, _ = greedy_counters(fresh.base_url, prompts, args.max_tokens)
            rows.append(row(f"after {steps}, fresh engine on the export", restarted))
        finally:
            fresh.stop()
    rows.append(row(f"base model with the MTP layer after {steps}, pushed", drafter_only))
    print(f"MTP loss per step: {', '.join(f'{loss:.3f}' for loss in losses)}")
    print("| engine | accepted / drafted tokens | acceptance rate | per draft position |")
    print("| --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
