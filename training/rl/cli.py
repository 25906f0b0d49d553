"""`cstack rl`: the whole RL loop locally, with a live display."""

from __future__ import annotations

import json
import uuid
from contextlib import ExitStack
from pathlib import Path

import typer


def rl(
    steps: int = typer.Option(20, help="Optimizer steps (each pushes new weights to vLLM)."),
    environment: str = typer.Option(
        "digits", help="digits or toolchoice (learnable on CPU), or coding."
    ),
    task: list[str] = typer.Option(
        [], "--task", help="Task ids (coding: folders in the task dir)."
    ),
    task_dir: Path = typer.Option(
        Path(".cstack/tasks"), help="Where `cstack tasks build --out` wrote the coding tasks."
    ),
    group_size: int = typer.Option(4, help="Rollouts per task per GRPO group."),
    groups_per_step: int = typer.Option(2, help="Task groups per optimizer step."),
    feedback: bool = typer.Option(True, help="Targeted text feedback (hint KL)."),
    feedback_config: Path | None = typer.Option(
        None,
        help="Triggers, hints and hint-KL coefficient as YAML (default: training/feedback.yaml).",
    ),
    model: Path | None = typer.Option(None, help="HF checkpoint to start from (default: tiny)."),
    workers: int = typer.Option(1, help="Rollout worker processes."),
    max_tokens: int = typer.Option(32, help="Max tokens per model turn."),
    lr: float = typer.Option(0.02, help="Muon learning rate (AdamW parts: lr / 10)."),
    seed: int = typer.Option(
        0, help="Seed of the trainer, the tiny checkpoint and rollout sampling."
    ),
    metrics_port: int | None = typer.Option(
        None, help="Serve trainer and staleness metrics here; workers use the next ports."
    ),
    redis_url: str = typer.Option("", help="Use this Redis instead of starting Valkey."),
    engine_url: list[str] = typer.Option(
        [], "--engine-url", help="Use these running vLLM engines (dev mode) instead of one."
    ),
    policy_url: str = typer.Option(
        "", help="Rollouts call the policy here, e.g. the gateway's /v1 (key: CSTACK_RL_API_KEY)."
    ),
    out: Path = typer.Option(Path(".cstack/rl"), help="Weights, logs and the step report."),
) -> None:
    """Run Valkey, a vLLM engine, rollout workers and the trainer; train with GRPO."""
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from training.feedback import DEFAULT_FEEDBACK_FILE, FeedbackConfigError, load_feedback_config
    from training.rl.session import RlSession, SessionConfig

    if environment not in ("digits", "toolchoice", "coding"):
        raise typer.BadParameter("must be digits, toolchoice or coding", param_hint="--environment")
    if environment == "coding" and not task:
        raise typer.BadParameter("coding needs --task ids from `cstack tasks build`")
    missing = [
        t for t in task if environment == "coding" and not (task_dir / t / "task.json").is_file()
    ]
    if missing:
        raise typer.BadParameter(
            f"no task.json for {missing[0]!r} in {task_dir}", param_hint="--task"
        )
    feedback_file = (feedback_config or DEFAULT_FEEDBACK_FILE).resolve()
    try:
        load_feedback_config(feedback_file)  # a bad file fails here, before anything starts
    except FeedbackConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--feedback-config") from None
    config = SessionConfig(
        steps=steps, environment=environment, task_ids=tuple(task), group_size=group_size,
        groups_per_step=groups_per_step, feedback=feedback, model=model, workers=workers,
        max_tokens=max_tokens, lr=lr, seed=seed, out=out, run_id=uuid.uuid4().hex[:8],
        task_dir=task_dir.resolve(), metrics_port=metrics_port, redis_url=redis_url,
        engine_urls=tuple(engine_url), policy_url=policy_url, feedback_config=feedback_file,
    )  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "steps.jsonl"
    with ExitStack() as stack, report_path.open("w") as report:
        session = RlSession(config, stack)
        for step in session.run():
            report.write(json.dumps(step.__dict__) + "\n")
            report.flush()
    typer.echo(f"step reports in {report_path}")
