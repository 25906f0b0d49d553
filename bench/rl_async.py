"""Async against synchronous RL: rollouts per second and the trainer's idle share, both
loops run here with the same seed, steps and engine.

    .venv/bin/python bench/rl_async.py --engine-url http://127.0.0.1:18000 \
        --model /tmp/tinymodel --steps 8

Each arm is one `cstack rl` run (Valkey, a rollout worker, the trainer, a weight push
into vLLM after every step) on the digits environment:

- async, the default: workers keep sampling while the trainer steps (two steps' groups
  queued), and rollouts up to ``--max-staleness 2`` versions old are trained on;
- synchronous (``--max-staleness 0``): one step's groups queued at a time, trained only
  on the current weights, so workers idle while the trainer steps and the trainer idles
  while they sample.

Both share ``--engine-url`` (a dev-mode engine with the weight-sync extension, e.g.
``cstack serve --variant shared --model DIR --weight-sync``), into which ``--model`` is
pushed before each arm so that both start from the same weights. Per arm, over the
loop's steps end to end: steps per minute, rollouts trained on per second, the trainer's
idle share (its wait for rollouts over the step's time, mean over steps), rollouts
sampled but not trained on (skipped, carried past the last step, or dropped as stale),
stale rollouts dropped, the mean staleness and the mean reward.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import ExitStack
from pathlib import Path

from rl_feedback import run_rl

from serving.valkey import running_valkey


def _arm(args: argparse.Namespace, name: str, staleness: int) -> list[dict]:
    flags = [
        "--steps", str(args.steps), "--environment", "digits", "--seed", str(args.seed),
        "--max-tokens", str(args.max_tokens), "--group-size", str(args.group_size),
        "--groups-per-step", str(args.groups_per_step), "--max-staleness", str(staleness),
        "--workers", str(args.workers),
        *(["--lr", str(args.lr)] if args.lr is not None else []),
    ]  # fmt: skip
    return run_rl(
        Path(args.out) / name, flags, model=args.model, engine_url=args.engine_url,
        redis_url=args.redis_url,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine-url", required=True, help="the engine both arms share")
    parser.add_argument("--model", type=Path, required=True, help="start checkpoint")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="rollout worker processes")
    parser.add_argument("--lr", type=float, help="Muon learning rate (default: cstack rl's)")
    parser.add_argument("--out", default=".cstack/bench-rl-async")
    args = parser.parse_args()
    print("| loop | steps / min | rollouts trained / s | trainer idle share | rollouts "
          "sampled, not trained | stale dropped | mean staleness | mean reward |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with ExitStack() as stack:
        args.redis_url = stack.enter_context(running_valkey())
        for name, staleness in (("async (default)", 2), ("synchronous", 0)):
            steps = _arm(args, name.split()[0], staleness)
            # The loop's own clock, its steps end to end (process start and shutdown, the
            # same for both arms, left out).
            loop_s = sum(s["seconds"] for s in steps)
            received = steps[-1]["rollouts_received"]
            trained = len(steps) * args.groups_per_step * args.group_size
            idle = statistics.fmean(s["trainer_idle_share"] for s in steps)
            print(
                f"| {name} | {60 * len(steps) / loop_s:.1f} | {trained / loop_s:.2f} | "
                f"{idle:.2f} | {received - trained} | {steps[-1]['dropped_stale']} | "
                f"{statistics.fmean(s['staleness'] for s in steps):.2f} | "
                f"{statistics.fmean(s['mean_reward'] for s in steps):.3f} |"
            )


if __name__ == "__main__":
    main()
