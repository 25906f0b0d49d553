"""Truncated importance sampling against PPO's clip in the real loop: mean reward, the
engine-trainer KL per token and the share of capped tokens, both arms with the same seeds,
steps and engine.

    .venv/bin/python bench/rl_correction.py --engine-url http://127.0.0.1:18000 \\
        --model /tmp/tinymodel --steps 12 --seeds 0,1,2

Each arm is one `cstack rl` run (digits, one rollout worker, a weight push into the
shared engine after every step) per seed, ``--correction tis`` or ``clip``; ``--model`` is
pushed into the engine before each run so that every run starts from the same weights.
The KL is measured from the engine's sampling logprobs and the trainer's before each
step: with asynchronous rollouts it includes up to ``max_staleness`` versions of drift.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path

from rl_feedback import run_rl

from serving.valkey import running_valkey


def run(args: argparse.Namespace, correction: str, seed: int) -> list[dict]:
    flags = [
        "--steps", str(args.steps), "--environment", "digits", "--seed", str(seed),
        "--max-tokens", str(args.max_tokens), "--group-size", str(args.group_size),
        "--groups-per-step", str(args.groups_per_step), "--correction", correction,
        "--lr", str(args.lr),
    ]  # fmt: skip
    return run_rl(
        Path(args.out) / f"{correction}-{seed}", flags, model=args.model,
        engine_url=args.engine_url, redis_url=args.redis_url,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine-url", required=True, help="the engine every run shares")
    parser.add_argument("--model", type=Path, required=True, help="start checkpoint")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", default=".cstack/bench-rl-correction")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    window = max(1, args.steps // 4)
    print("| correction | seed | reward, first / last steps | mean reward | engine-trainer KL "
          "per token | capped share |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    with ExitStack() as stack:
        args.redis_url = stack.enter_context(running_valkey())
        means: dict[str, list[float]] = {"tis": [], "clip": []}
        for seed in seeds:
            for correction in ("tis", "clip"):
                steps = run(args, correction, seed)
                rewards = [s["mean_reward"] for s in steps]
                means[correction].append(statistics.fmean(rewards))
                print(
                    f"| {correction} | {seed} | {statistics.fmean(rewards[:window]):.3f} / "
                    f"{statistics.fmean(rewards[-window:]):.3f} | "
                    f"{statistics.fmean(rewards):.3f} | "
                    f"{statistics.fmean(s['mismatch_kl'] for s in steps):.4f} | "
                    f"{statistics.fmean(s['capped_share'] for s in steps):.4f} |"
                )
    for correction, values in means.items():
        print(f"{correction}: whole-run mean reward over seeds {statistics.fmean(values):.3f}")


if __name__ == "__main__":
    main()
