"""RL loop on CPU: does mean reward rise, and does targeted text feedback make the
invalid-tool-call rate fall faster? Both arms run here with the same seed and steps.

    .venv/bin/python bench/rl_feedback.py --environment toolchoice \
        --model .cstack/toolchoice-warm --steps 12

Each arm is one `cstack rl` run: Valkey, rollout worker, trainer, a weight push into vLLM
after every step. Without ``--engine-url`` each arm starts its own vLLM; with it, both
arms share that (dev-mode, extension-enabled) engine and the script first pushes
``--model`` into it (``run_rl``, which bench/rl_async.py and rl_correction.py use too), so each arm
starts from the same weights. Prints per-step curves and the first-quarter /
last-quarter / whole-run means of both arms. ``--seeds 0,1,2`` runs
both arms once per seed and ends with the averages over seeds; ``--kl-coef`` overrides the
hint-KL coefficient of training/rl/feedback.yaml (through ``cstack rl --feedback-config``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path

from serving.valkey import running_valkey


def reset_engine(url: str, model: Path, redis_url: str) -> None:
    """Put ``model`` into the engine (exact reload) so the arm starts from it."""
    import redis

    from training.rl.rollouts.gate import PolicyVersionGate
    from training.rl.rollouts.weight_sync import VllmWeightSync

    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), f"bench-reset-{uuid.uuid4().hex}")
    VllmWeightSync([url], gate).push(model.resolve())


def _feedback_config(out: Path, kl_coef: float) -> Path:
    """training/rl/feedback.yaml with another hint-KL coefficient."""
    import yaml

    from training.rl.feedback import DEFAULT_FEEDBACK_FILE

    config = yaml.safe_load(DEFAULT_FEEDBACK_FILE.read_text())
    config["kl_coef"] = kl_coef
    out.mkdir(parents=True, exist_ok=True)
    path = out / "feedback.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_rl(
    out: Path, flags: list[str], *, model: Path | None, engine_url: str = "", redis_url: str = ""
) -> list[dict[str, float]]:
    """One `cstack rl --out out *flags` run (from ``model``; on ``engine_url``, first reset
    to ``model``, and ``redis_url``, when given); its step reports."""
    command = [sys.executable, "-m", "deploy.cli", "rl", "--out", str(out), *flags]
    if model:
        command += ["--model", str(model)]
    if engine_url:
        assert model is not None, "a shared engine is reset to the start checkpoint"
        reset_engine(engine_url, model, redis_url)
        command += ["--engine-url", engine_url, "--redis-url", redis_url]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def _arm(args: argparse.Namespace, seed: int, feedback: bool) -> list[dict[str, float]]:
    out = Path(args.out) / f"seed-{seed}" / ("feedback" if feedback else "no-feedback")
    flags = [
        "--steps", str(args.steps), "--environment", args.environment, "--seed", str(seed),
        "--max-tokens", str(args.max_tokens),
        *(["--lr", str(args.lr)] if args.lr is not None else []),
        "--group-size", str(args.group_size), "--groups-per-step", str(args.groups_per_step),
        "--feedback" if feedback else "--no-feedback",
    ]  # fmt: skip
    if args.kl_coef is not None:
        flags += ["--feedback-config", str(_feedback_config(Path(args.out), args.kl_coef))]
    return run_rl(
        out, flags, model=args.model, engine_url=args.engine_url, redis_url=args.redis_url
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _summary(steps: list[dict[str, float]], window: int) -> dict[str, float]:
    summary = {}
    for name, key in (("reward", "mean_reward"), ("invalid", "invalid_tool_rate")):
        values = [step[key] for step in steps]
        summary[f"{name} first"] = _mean(values[:window])
        summary[f"{name} last"] = _mean(values[-window:])
        summary[f"{name} all"] = _mean(values)
    return summary


def _print_table(title: str, rows: dict[str, dict[str, float]]) -> None:
    columns = list(next(iter(rows.values())))
    print(f"\n{title}")
    print(f"{'arm':<12} " + " ".join(f"{c:>13}" for c in columns) + f" {'invalid drop':>13}")
    for name, row in rows.items():
        drop = row["invalid first"] - row["invalid last"]
        print(f"{name:<12} " + " ".join(f"{row[c]:>13.3f}" for c in columns) + f" {drop:>13.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--environment", default="toolchoice")
    parser.add_argument("--model", type=Path, default=None, help="start checkpoint")
    parser.add_argument("--seeds", default="0", help="comma-separated; both arms per seed")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--lr", type=float, help="Muon learning rate (default: cstack rl's)")
    parser.add_argument("--kl-coef", type=float, default=None, help="hint-KL coefficient")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--engine-url", default="", help="share this engine (see above)")
    parser.add_argument("--out", default=".cstack/bench-rl")
    args = parser.parse_args()
    if args.engine_url and not args.model:
        parser.error("--engine-url needs --model (the weights both arms start from)")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: expected integers like 0,1,2, got {args.seeds!r}")
    names = ("feedback", "no-feedback")
    window = max(1, args.steps // 4)
    summaries: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with ExitStack() as stack:
        args.redis_url = stack.enter_context(running_valkey()) if args.engine_url else ""
        for seed in seeds:
            arms = {name: _arm(args, seed, name == "feedback") for name in names}
            print(f"\nseed {seed}")
            print("step " + "  ".join(f"{n + ' reward':>20} {n + ' invalid':>21}" for n in arms))
            for i in range(args.steps):
                cells = [f"{arms[n][i]['mean_reward']:>20.3f} "
                         f"{arms[n][i]['invalid_tool_rate']:>21.3f}" for n in arms]  # fmt: skip
                print(f"{i + 1:>4} " + "  ".join(cells))
            rows = {name: _summary(steps, window) for name, steps in arms.items()}
            _print_table(f"seed {seed}: first/last {window} steps and all", rows)
            for name in names:
                summaries[name].append(rows[name])
    if len(seeds) > 1:
        mean_rows = {
            name: {c: _mean([row[c] for row in rows]) for c in rows[0]}
            for name, rows in summaries.items()
        }
        _print_table(f"mean over seeds {args.seeds}", mean_rows)
        _print_paired(seeds, summaries)


def _print_paired(seeds: list[int], summaries: dict[str, list[dict[str, float]]]) -> None:
    """Whole-run invalid rate (the area under its curve: lower means it fell faster), seed
    by seed: the same seed gives both arms the same sampling, so the arms pair up."""
    import statistics

    differences = [
        with_fb["invalid all"] - without["invalid all"]
        for with_fb, without in zip(summaries["feedback"], summaries["no-feedback"], strict=True)
    ]
    print("\nwhole-run invalid rate, feedback minus no feedback, per seed:")
    print("  " + "  ".join(f"seed {s}: {d:+.3f}" for s, d in zip(seeds, differences, strict=True)))
    mean = statistics.fmean(differences)
    spread = statistics.stdev(differences)
    t = mean / (spread / len(differences) ** 0.5) if spread > 0 else float("inf")
    lower = sum(d < 0 for d in differences)
    print(f"  mean {mean:+.4f}, sd {spread:.4f}, paired t {t:+.2f} over {len(differences)} seeds; "
          f"feedback lower in {lower} of {len(differences)}")  # fmt: skip


if __name__ == "__main__":
    main()
