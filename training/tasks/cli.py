"""`cstack tasks ...`: build feature-deletion tasks and score a sandbox against one."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import typer

tasks_app = typer.Typer(help="Synthetic coding tasks by feature deletion.", no_args_is_help=True)


@tasks_app.command("build")
def build(
    out: Path = typer.Option(..., "--out", help="Folder to write one sub-folder per task into."),
    repo: Path | None = typer.Option(
        None, "--repo", help="A Python repository whose pytest suite passes."
    ),
    pypi: list[str] = typer.Option(
        [], "--pypi", help="Fetch this sdist (NAME==VERSION) and build from it; repeatable."
    ),
    max_tasks: int = typer.Option(5, help="Tasks to keep per codebase."),
    max_candidates: int = typer.Option(25, help="Features to try per codebase."),
    only: list[str] = typer.Option([], "--only", help="Only try these feature names."),
    timeout_s: float = typer.Option(300.0, "--timeout", help="Seconds per suite run."),
) -> None:
    """Delete one testable feature at a time; keep tasks with FAIL_TO_PASS and PASS_TO_PASS."""
    from training.tasks.builder import (
        BuildConfig,
        TaskBuildError,
        build_tasks,
        log_failed_build,
    )
    from training.tasks.pypi import FetchError, fetch_sdist

    if (repo is None) == (not pypi):
        raise typer.BadParameter("give either --repo DIR or one or more --pypi NAME==VERSION")
    if repo is not None and not repo.is_dir():
        raise typer.BadParameter(f"{repo} is not a directory", param_hint="--repo")
    total, failed = 0, 0
    with tempfile.TemporaryDirectory(prefix="cstack-fetch-") as scratch:
        for requirement in pypi or [""]:
            if repo is not None:
                name = repo.resolve().name
            else:
                name = re.sub(r"[^A-Za-z0-9_.-]+", "_", requirement)
            try:
                if repo is not None:
                    root = repo
                else:
                    typer.echo(f"fetching {requirement} ...")
                    root = fetch_sdist(requirement, Path(scratch) / name)
                config = BuildConfig(max_tasks, max_candidates, timeout_s, tuple(only), name)
                report = build_tasks(root, out, config, log=lambda line: typer.echo(f"  {line}"))
            except (FetchError, TaskBuildError) as err:
                # One codebase that gives nothing does not stop the others.
                typer.echo(f"error: {name}: {err}", err=True)
                log_failed_build(out, name, str(err))
                failed += 1
                continue
            total += len(report.tasks)
            typer.echo(f"{name}: {len(report.tasks)} tasks, {len(report.rejected)} rejected")
    typer.echo(f"{total} tasks written to {out}")
    if total == 0 or failed:
        raise typer.Exit(1)


@tasks_app.command("stats")
def stats(
    tasks: Path = typer.Option(..., "--tasks", help="An output folder of `tasks build`."),
) -> None:
    """Per codebase: candidates tried, tasks kept, and rejections by reason."""
    from training.tasks.stats import build_stats

    try:
        rows = build_stats(tasks)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--tasks") from None
    typer.echo("codebase\tbaseline tests\tcandidates\tkept\trejected (why)")
    for row in rows:
        if row.failed:
            typer.echo(f"{row.source}\t\t\t0\tno tasks: {row.failed}")
            continue
        why = "; ".join(f"{count} {kind}" for kind, count in row.rejected.most_common())
        rejected = sum(row.rejected.values())
        typer.echo(
            f"{row.source}\t{row.baseline_passed}\t{row.candidates}\t{row.kept}\t"
            f"{rejected}{f' ({why})' if why else ''}"
        )
    typer.echo(f"total\t\t{sum(r.candidates for r in rows)}\t{sum(r.kept for r in rows)}\t"
               f"{sum(sum(r.rejected.values()) for r in rows)}")  # fmt: skip


@tasks_app.command("score")
def score(
    task: Path = typer.Option(..., "--task", help="A task folder written by `tasks build`."),
    sandbox: Path = typer.Option(..., "--sandbox", help="The edited copy of the task's repo/."),
) -> None:
    """Run the harness-owned reward: tests reset to their originals, F2P and P2P only."""
    from training.tasks.reward import evaluate_sandbox, task_reward

    if not (task / "task.json").is_file():
        raise typer.BadParameter(f"{task} has no task.json", param_hint="--task")
    if not sandbox.is_dir():
        raise typer.BadParameter(f"{sandbox} is not a directory", param_hint="--sandbox")
    outcome = evaluate_sandbox(task, sandbox)
    for name, results in (
        ("FAIL_TO_PASS", outcome.fail_to_pass),
        ("PASS_TO_PASS", outcome.pass_to_pass),
    ):
        typer.echo(f"{name}: {sum(results.values())}/{len(results)} pass")
    typer.echo(f"reward: {task_reward(outcome):.3f}")
