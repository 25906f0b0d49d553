"""What the curriculum buys at a fixed rollout budget: the training loop's task choice and
group filter (``training.rl.learner.curriculum``, the code `cstack rl` runs) against uniform
sampling that trains on every group, on a suite of mixed difficulty.

The learner is simulated, and says so: a task's rollouts pass with probability
``sigmoid(skill)``, and every group the trainer steps on moves that task's skill by
``--lr`` times the group's mean absolute advantage (a GRPO step's push; a group whose
rewards are all equal has none and teaches nothing), whatever else the step holds: Muon's
update size does not depend on the gradient's scale, so a group without advantage in the
same step neither helps nor dilutes it, it only spends rollouts and a batch slot. The
suite has, in equal parts, easy tasks (pass rate 0.95 at the start), medium ones (0.5)
and hard ones (0.05). Each arm spends the same number of rollouts (skipped groups cost
theirs too) in steps of ``--groups-per-step`` trained groups, and reports:

- the share of trained groups with zero advantage (the target: under 10%);
- the suite's mean pass rate at the end (the true probabilities, every task of the suite
  weighted alike), i.e. the reward reached for the budget;
- rollouts spent on groups that were skipped or taught nothing.

Run: ``.venv/bin/python bench/curriculum.py [--rollouts 1000] [--seeds 20]``
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import dataclass

from training.rl.learner.curriculum import Curriculum, CurriculumConfig

START_PASS_RATES = {"easy": 0.95, "medium": 0.5, "hard": 0.05}


@dataclass(frozen=True)
class ArmResult:
    zero_advantage_share: float
    final_pass_rate: float
    wasted_rollouts: int


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def run_arm(config: CurriculumConfig, args: argparse.Namespace, seed: int) -> ArmResult:
    tasks = [f"{kind}-{i}" for kind in START_PASS_RATES for i in range(args.tasks_per_kind)]
    skill = {t: logit(START_PASS_RATES[t.split("-")[0]]) for t in tasks}
    curriculum = Curriculum(tasks, config, seed=seed)
    draw = random.Random(seed + 10_000)
    spent = trained = zero = wasted = 0
    while spent + args.group_size <= args.rollouts:
        step: list[tuple[str, list[float]]] = []
        while len(step) < args.groups_per_step and spent + args.group_size <= args.rollouts:
            task = curriculum.choose()
            p = 1 / (1 + math.exp(-skill[task]))
            rewards = [float(draw.random() < p) for _ in range(args.group_size)]
            spent += args.group_size
            curriculum.record(task, rewards)
            if curriculum.trains_on(rewards):
                step.append((task, rewards))
            else:
                wasted += args.group_size
        for task, rewards in step:
            trained += 1
            mean = sum(rewards) / len(rewards)
            spread = statistics.stdev(rewards) if len(set(rewards)) > 1 else 0.0
            if spread == 0.0:
                zero += 1
                wasted += args.group_size
                continue
            push = sum(abs(r - mean) for r in rewards) / len(rewards) / spread
            # Toward the rewarded behaviour: a passing rollout's advantage is positive.
            skill[task] += args.lr * push
    final = sum(1 / (1 + math.exp(-s)) for s in skill.values()) / len(skill)
    return ArmResult(zero / max(trained, 1), final, wasted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000, help="budget per arm and seed")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--tasks-per-kind", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.15, help="skill gained per unit push")
    args = parser.parse_args()
    arms = {
        "curriculum (learnability + dynamic sampling, the default)": CurriculumConfig(),
        "uniform, every group trained on": CurriculumConfig(
            sampling="uniform", dynamic_sampling=False
        ),
        "uniform + dynamic sampling": CurriculumConfig(sampling="uniform"),
        "learnability, no dynamic sampling": CurriculumConfig(dynamic_sampling=False),
    }
    print(
        f"{args.rollouts} rollouts per arm, {args.seeds} seeds, "
        f"{3 * args.tasks_per_kind} tasks (easy/medium/hard at "
        f"{'/'.join(str(p) for p in START_PASS_RATES.values())}), groups of "
        f"{args.group_size}, lr {args.lr}"
    )
    print("| arm | zero-advantage share of trained groups | suite pass rate at the end "
          "| rollouts wasted |")  # fmt: skip
    print("| --- | --- | --- | --- |")
    start = sum(START_PASS_RATES.values()) / len(START_PASS_RATES)
    for name, config in arms.items():
        results = [run_arm(config, args, seed) for seed in range(args.seeds)]
        zero = [r.zero_advantage_share for r in results]
        final = [r.final_pass_rate for r in results]
        wasted = [r.wasted_rollouts for r in results]
        print(
            f"| {name} | {statistics.mean(zero):.1%} (sd {statistics.stdev(zero):.1%}) "
            f"| {statistics.mean(final):.3f} (sd {statistics.stdev(final):.3f}; "
            f"start {start:.3f}) | {statistics.mean(wasted):.0f} |"
        )


if __name__ == "__main__":
    main()
