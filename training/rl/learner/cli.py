"""`cstack rl`: the whole RL loop locally, with a live display.

The options are the fields of ``SessionConfig`` declared with help text
(``training/trainer/options.py``). The session (torch, vLLM clients) is imported only when the
command runs, so that `cstack --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import ExitStack
from typing import Any

import typer

from training.rl.feedback import FeedbackConfigError, load_feedback_config
from training.rl.learner.config import SessionConfig, parse_task_styles
from training.trainer.options import build_config, check_choices, cli_options, typer_command

SESSION_OPTIONS = cli_options(SessionConfig)


def _rl(values: dict[str, Any]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = _checked_config(values)
    from serving.process import StopRequested, stop_signals_raise
    from training.rl.learner.session import RlSession

    config.out_dir.mkdir(parents=True, exist_ok=True)
    report_path = config.out_dir / "steps.jsonl"
    try:
        # Exited last to first: the stop signals are ignored before the stack closes
        # (stopping Valkey, vLLM and the workers), so a second Ctrl-C or SIGTERM cannot
        # cut that cleanup short.
        with (
            ExitStack() as stack,
            report_path.open("w") as report,
            stop_signals_raise() as stop_signals,
        ):
            session = RlSession(config, stack)
            for step in session.run():
                report.write(json.dumps(step.__dict__) + "\n")
                report.flush()
                stop_signals.raise_if_received()
    except StopRequested as stop:
        typer.echo(f"stopped ({stop}); step reports in {report_path}")
        raise typer.Exit(stop.exit_code) from None
    typer.echo(f"step reports in {report_path}")


def _checked_config(values: dict[str, Any]) -> SessionConfig:
    """The session config from the flags, refused (before anything starts) when the
    environment, its tasks, a task style or the feedback file are wrong; paths made
    absolute."""
    error = check_choices(SESSION_OPTIONS, values)
    if error:
        raise typer.BadParameter(error)
    config: SessionConfig = build_config(SessionConfig, SESSION_OPTIONS, values)
    for flag, value, least in (
        ("--steps", config.steps, 1), ("--group-size", config.group_size, 2),
        ("--groups-per-step", config.groups_per_step, 1), ("--workers", config.workers, 1),
        ("--max-tokens", config.max_tokens, 1), ("--max-staleness", config.max_staleness, 0),
    ):  # fmt: skip
        if value < least:
            raise typer.BadParameter(f"must be at least {least}, not {value}", param_hint=flag)
    if config.heartbeat_s <= 0:
        raise typer.BadParameter(
            f"must be more than 0, not {config.heartbeat_s}", param_hint="--heartbeat-s"
        )
    if config.environment == "toolchoice":
        from training.rl.rollouts.environments import toolchoice_available

        for task_id in config.rollout_task_ids:
            try:
                toolchoice_available(task_id)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--task") from None
    coding = config.environment == "coding"
    if coding and not config.task_ids:
        raise typer.BadParameter("coding needs --task ids from `cstack tasks build`")
    missing = [t for t in config.task_ids if coding and not _has_task(config, t)]
    if missing:
        raise typer.BadParameter(
            f"no task.json for {missing[0]!r} in {config.task_dir}", param_hint="--task"
        )
    try:
        parse_task_styles(config.task_styles, config.rollout_task_ids)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--task-style") from None
    feedback_file = config.feedback_file.resolve()
    try:
        load_feedback_config(feedback_file)  # a bad file fails here, before anything starts
    except FeedbackConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--feedback-config") from None
    return dataclasses.replace(
        config,
        task_dir=config.task_dir.resolve(),
        feedback_config=feedback_file,
        out=config.out_dir,  # the state directory read once, here
    )


def _has_task(config: SessionConfig, task_id: str) -> bool:
    return (config.task_dir / task_id / "task.json").is_file()


rl = typer_command(
    SESSION_OPTIONS,
    _rl,
    """Run Valkey, a vLLM engine, rollout workers and the trainer; train with GRPO.

    Shows a live table on a terminal; piped (CI, a log file), a line per phase and per
    step, and a heartbeat line while a step runs longer than --heartbeat-s.

    Ctrl-C or SIGTERM stops everything it started (Valkey, vLLM, the rollout workers)
    before it exits.

    State (weights, logs, steps.jsonl, the tiny checkpoint) goes to --out, by default
    rl/ in the state directory `cstack up` uses (CSTACK_STATE_DIR, default .cstack).
    """,
)
