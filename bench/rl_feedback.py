"""RL loop on CPU: does mean reward rise, and does targeted text feedback make the
invalid-tool-call rate fall faster? Both arms run here with the same seed and steps.

    .venv/bin/python bench/rl_feedback.py --environment toolchoice \
        --model .cstack/toolchoice-warm --steps 12

Each arm is one `cstack rl` run: Valkey, rollout worker, trainer, a weight push into vLLM
after every step. Without ``--engine-url`` each arm starts its own vLLM; with it, both
arms share that (dev-mode, extension-enabled) engine and the script first pushes
``--model`` into it, so each arm starts from the same weights. Prints per-step curves and
the first-quarter / last-quarter / whole-run means of both arms.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path

from training.rl.stack import start_valkey


def _reset_engine(url: str, model: Path, redis_url: str) -> None:
    """Put ``model`` into the engine (exact reload) so the arm starts from it."""
    import redis

    from training.rollouts import PolicyVersionGate, VllmWeightSync

    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), f"bench-reset-{uuid.uuid4().hex}")
    VllmWeightSync([url], gate).push(model.resolve())


def _arm(args: argparse.Namespace, feedback: bool) -> list[dict[str, float]]:
    out = Path(args.out) / ("feedback" if feedback else "no-feedback")
    command = [
        sys.executable, "-m", "deploy.cli", "rl", "--steps", str(args.steps),
        "--environment", args.environment, "--seed", str(args.seed), "--out", str(out),
        "--max-tokens", str(args.max_tokens), "--lr", str(args.lr),
        "--group-size", str(args.group_size), "--groups-per-step", str(args.groups_per_step),
        "--feedback" if feedback else "--no-feedback",
    ]  # fmt: skip
    if args.model:
        command += ["--model", str(args.model)]
    if args.engine_url:
        _reset_engine(args.engine_url, args.model, args.redis_url)
        command += ["--engine-url", args.engine_url, "--redis-url", args.redis_url]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--environment", default="toolchoice")
    parser.add_argument("--model", type=Path, default=None, help="start checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--engine-url", default="", help="share this engine (see above)")
    parser.add_argument("--out", default=".cstack/bench-rl")
    args = parser.parse_args()
    if args.engine_url and not args.model:
        parser.error("--engine-url needs --model (the weights both arms start from)")
    with ExitStack() as stack:
        args.redis_url = start_valkey(stack) if args.engine_url else ""
        arms = {name: _arm(args, name == "feedback") for name in ("feedback", "no-feedback")}
    print("step " + "  ".join(f"{n + ' reward':>20} {n + ' invalid':>21}" for n in arms))
    for i in range(args.steps):
        cells = [f"{arms[n][i]['mean_reward']:>20.3f} {arms[n][i]['invalid_tool_rate']:>21.3f}"
                 for n in arms]  # fmt: skip
        print(f"{i + 1:>4} " + "  ".join(cells))
    window = max(1, args.steps // 4)
    print(f"\n{'arm':<12} {'reward first':>12} {'reward last':>12} {'reward all':>11} "
          f"{'invalid first':>14} {'invalid last':>13} {'invalid all':>12}")  # fmt: skip
    for name, steps in arms.items():
        first, last = steps[:window], steps[-window:]
        print(
            f"{name:<12} {_mean([s['mean_reward'] for s in first]):>12.3f} "
            f"{_mean([s['mean_reward'] for s in last]):>12.3f} "
            f"{_mean([s['mean_reward'] for s in steps]):>11.3f} "
            f"{_mean([s['invalid_tool_rate'] for s in first]):>14.3f} "
            f"{_mean([s['invalid_tool_rate'] for s in last]):>13.3f} "
            f"{_mean([s['invalid_tool_rate'] for s in steps]):>12.3f}"
        )


if __name__ == "__main__":
    main()
