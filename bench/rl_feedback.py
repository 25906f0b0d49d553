"""RL loop on CPU with the tiny model: does mean reward rise, and how does targeted text
feedback change the invalid-tool-call rate? Both arms run here, same seed, same steps.

    .venv/bin/python bench/rl_feedback.py --steps 20 --environment digits

Each arm is one `cstack rl` run (its own Valkey, vLLM with reload endpoints, rollout
worker, trainer); the script reads both step reports and prints the comparison.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def _arm(args: argparse.Namespace, feedback: bool) -> list[dict[str, float]]:
    out = Path(args.out) / ("feedback" if feedback else "no-feedback")
    command = [
        sys.executable, "-m", "deploy.cli", "rl", "--steps", str(args.steps),
        "--environment", args.environment, "--seed", str(args.seed), "--out", str(out),
        "--max-tokens", str(args.max_tokens), "--feedback" if feedback else "--no-feedback",
    ]  # fmt: skip
    subprocess.run(command, check=True)
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--environment", default="digits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default=".cstack/bench-rl")
    args = parser.parse_args()
    window = max(1, args.steps // 4)
    print(f"{'arm':<12} {'reward first':>12} {'reward last':>12} {'rise':>8} "
          f"{'invalid first':>14} {'invalid last':>13}")  # fmt: skip
    for feedback in (True, False):
        steps = _arm(args, feedback)
        first, last = steps[:window], steps[-window:]
        reward_first = _mean([s["mean_reward"] for s in first])
        reward_last = _mean([s["mean_reward"] for s in last])
        invalid_first = _mean([s["invalid_tool_rate"] for s in first])
        invalid_last = _mean([s["invalid_tool_rate"] for s in last])
        name = "feedback" if feedback else "no-feedback"
        print(f"{name:<12} {reward_first:>12.3f} {reward_last:>12.3f} "
              f"{reward_last / max(reward_first, 1e-9):>7.2f}x {invalid_first:>14.3f} "
              f"{invalid_last:>13.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
