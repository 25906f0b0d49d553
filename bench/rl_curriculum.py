"""The curriculum in the real loop: the learnability draw with dynamic sampling (the
default) against uniform sampling with every group trained on, at the same rollout budget.

    .venv/bin/python bench/rl_curriculum.py --engine-url http://127.0.0.1:18000 \\
        --model .cstack/toolchoice-warm --steps 16 --seeds 0,1,2

Suite (``toolchoice``): tools-0 to tools-3 (four of the eight tool names valid) and their
variants @2 and @1 (two, one valid): twelve tasks whose pass rates start near 0.5, 0.25
and 0.125 for the model bench/rl_toolchoice.py warms up. Each arm is one `cstack rl` run
from ``--model`` (the shared engine reset to it first; text feedback off in both, so that
only the task draw and the group filter differ): the curriculum arm for ``--steps``, the
uniform arm for as many steps as match the rollouts the curriculum arm sampled (its
skipped groups cost rollouts too). Per arm it prints the zero-advantage share of the
groups trained on and their mean reward, and then the final policy
(the engine holds the run's last push) on the whole suite: ``--eval-samples`` replies per
task at temperature 1, the share that name a tool the task offers.
"""

from __future__ import annotations

import argparse
import math
import statistics
from contextlib import ExitStack
from pathlib import Path

import httpx
from rl_feedback import reset_engine, run_rl

from serving.valkey import running_valkey
from training.rl.rewards import toolchoice_reward
from training.rl.rollouts.environments import toolchoice_available, toolchoice_prompt

SUITE = [f"tools-{k}{variant}" for variant in ("", "@2", "@1") for k in range(4)]


def suite_pass_rate(engine_url: str, samples: int, max_tokens: int) -> dict[str, float]:
    """Each task's share of ``samples`` replies (temperature 1) naming a tool it offers:
    what the environment rewards."""
    rates = {}
    with httpx.Client(base_url=engine_url, timeout=120) as client:
        for task_id in SUITE:
            reply = client.post(
                "/v1/chat/completions",
                json={
                    "model": "composer-2.5",
                    "messages": [{"role": "user", "content": toolchoice_prompt(task_id)}],
                    "max_tokens": max_tokens, "temperature": 1.0, "n": samples,
                },
            )  # fmt: skip
            reply.raise_for_status()
            texts = [c["message"]["content"] for c in reply.json()["choices"]]
            rates[task_id] = (
                sum(toolchoice_reward(toolchoice_available(task_id), t) for t in texts) / samples
            )
    return rates


def one_tool_share(rates: dict[str, float]) -> float:
    """The mean pass rate of the hardest tasks (one tool offered)."""
    return statistics.fmean(rate for task_id, rate in rates.items() if task_id.endswith("@1"))


def arm(args: argparse.Namespace, name: str, seed: int, steps: int) -> dict[str, float]:
    flags = [
        "--steps", str(steps), "--environment", "toolchoice", "--seed", str(seed),
        "--max-tokens", str(args.max_tokens), "--no-feedback",
        "--group-size", str(args.group_size), "--groups-per-step", str(args.groups_per_step),
    ]  # fmt: skip
    if args.lr is not None:
        flags += ["--lr", str(args.lr)]
    for task_id in SUITE:
        flags += ["--task", task_id]
    if name == "uniform":
        flags += ["--sampling", "uniform", "--no-dynamic-sampling"]
    reports = run_rl(
        Path(args.out) / f"{name}-{seed}", flags, model=args.model,
        engine_url=args.engine_url, redis_url=args.redis_url,
    )  # fmt: skip
    trained = len(reports) * args.groups_per_step
    rates = suite_pass_rate(args.engine_url, args.eval_samples, args.max_tokens)
    return {
        "steps": len(reports),
        "rollouts": reports[-1]["rollouts_received"],
        "zero_advantage_share": sum(r["zero_advantage_groups"] for r in reports) / trained,
        "skipped_groups": sum(r["skipped_groups"] for r in reports),
        "mean_reward": statistics.fmean(r["mean_reward"] for r in reports),
        "retired": reports[-1]["retired_tasks"],
        "suite": statistics.fmean(rates.values()),
        "hardest": one_tool_share(rates),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine-url", required=True, help="the engine every run shares")
    parser.add_argument("--model", type=Path, required=True, help="start checkpoint")
    parser.add_argument("--steps", type=int, default=16, help="the curriculum arm's steps")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--lr", type=float, help="Muon learning rate (default: cstack rl's)")
    parser.add_argument("--eval-samples", type=int, default=64, help="replies per task")
    parser.add_argument("--out", default=".cstack/bench-rl-curriculum")
    args = parser.parse_args()
    per_step = args.group_size * args.groups_per_step
    print("| arm | seed | steps | rollouts sampled | zero-advantage share of trained groups "
          "| groups skipped | mean reward, groups trained on | tasks retired "
          "| suite pass rate after | @1 tasks after |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with ExitStack() as stack:
        args.redis_url = stack.enter_context(running_valkey())
        reset_engine(args.engine_url, args.model, args.redis_url)
        start = suite_pass_rate(args.engine_url, args.eval_samples, args.max_tokens)
        print(f"| start ({args.model}) | | | | | | | | {statistics.fmean(start.values()):.3f} "
              f"| {one_tool_share(start):.3f} |")  # fmt: skip
        suites: dict[str, list[float]] = {"curriculum": [], "uniform": []}
        for seed in (int(s) for s in args.seeds.split(",")):
            curriculum = arm(args, "curriculum", seed, args.steps)
            uniform = arm(args, "uniform", seed, math.ceil(curriculum["rollouts"] / per_step))
            for name, row in (("curriculum", curriculum), ("uniform", uniform)):
                suites[name].append(row["suite"])
                print(f"| {name} | {seed} | {row['steps']} | {row['rollouts']} | "
                      f"{row['zero_advantage_share']:.1%} | {row['skipped_groups']} | "
                      f"{row['mean_reward']:.3f} | {row['retired']} | {row['suite']:.3f} | "
                      f"{row['hardest']:.3f} |")  # fmt: skip
    for name, values in suites.items():
        print(f"{name}: suite pass rate after, mean over seeds {statistics.fmean(values):.3f}")


if __name__ == "__main__":
    main()
