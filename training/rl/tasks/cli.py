"""`cstack tasks ...`: build feature-deletion tasks and score a sandbox against one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from collections.abc import Iterator

    from training.rl.tasks.builder import BuildConfig
    from training.rl.tasks.spread import Codebase, Outcome

tasks_app = typer.Typer(help="Synthetic coding tasks by feature deletion.", no_args_is_help=True)


@tasks_app.command("build")
def build(
    out: Path = typer.Option(..., "--out", help="Folder to write one sub-folder per task into."),
    repo: list[Path] = typer.Option(
        [], "--repo", help="A Python repository whose pytest suite passes; repeatable."
    ),
    pypi: list[str] = typer.Option(
        [],
        "--pypi",
        help="Fetch this sdist (NAME==VERSION) and build from it; repeatable. "
        "Kept after the first download in CSTACK_TASKS_SDIST_CACHE (.cstack/sdists).",
    ),
    max_tasks: int = typer.Option(5, help="Tasks to keep per codebase."),
    max_candidates: int = typer.Option(25, help="Features to try per codebase."),
    only: list[str] = typer.Option([], "--only", help="Only try these feature names."),
    timeout_s: float = typer.Option(300.0, "--timeout", help="Seconds per suite run."),
    harder_variants: bool = typer.Option(
        True,
        help="Also build each kept task's harder variant: its feature and another kept "
        "one's deleted together (the RL curriculum adds it once the task is solved).",
    ),
    celery: bool = typer.Option(
        False,
        "--celery",
        help="Spread the codebases over `cstack worker tasks` workers (one job each, through "
        "CSTACK_REDIS_URL) instead of building them here; --out must be a folder the "
        "workers share.",
    ),
    wait_s: float = typer.Option(
        3600.0, "--wait", help="With --celery: give up when no build finishes for this long."
    ),
) -> None:
    """Delete one testable feature at a time; keep tasks with FAIL_TO_PASS and PASS_TO_PASS."""
    from training.rl.tasks.builder import BuildConfig
    from training.rl.tasks.spread import Codebase, build_codebase, settings

    if not repo and not pypi:
        raise typer.BadParameter("give one or more --repo DIR or --pypi NAME==VERSION")
    for folder in repo:
        if not folder.is_dir():
            raise typer.BadParameter(f"{folder} is not a directory", param_hint="--repo")
    for number, value in (("--max-tasks", max_tasks), ("--max-candidates", max_candidates)):
        if value < 1:
            raise typer.BadParameter(f"must be at least 1, got {value}", param_hint=number)
    codebases = [Codebase(repo=str(folder.resolve())) for folder in repo]
    codebases += [Codebase(requirement=requirement) for requirement in pypi]
    config = BuildConfig(
        max_tasks, max_candidates, timeout_s, tuple(only), harder_variants=harder_variants
    )
    if celery:
        results = _build_on_workers(codebases, out, config, wait_s)
    else:
        results = (
            build_codebase(
                codebase, out, config, lambda line: typer.echo(f"  {line}"),
                settings.tasks_sdist_cache,
            )
            for codebase in codebases
        )  # fmt: skip
    total = variants = failed = 0
    for outcome in results:
        if outcome.error:
            typer.echo(f"error: {outcome.source}: {outcome.error}", err=True)
            failed += 1
        else:
            typer.echo(
                f"{outcome.source}: {outcome.tasks} tasks (+{outcome.variants} harder "
                f"variants), {outcome.rejected} rejected"
            )
        total += outcome.tasks
        variants += outcome.variants
    typer.echo(f"{total} tasks (+{variants} harder variants) written to {out}")
    if total == 0 or failed:
        raise typer.Exit(1)


def _build_on_workers(
    codebases: list[Codebase], out: Path, config: BuildConfig, wait_s: float
) -> Iterator[Outcome]:
    import redis

    from training.rl.tasks.spread import celery_app, outcomes, outcomes_client, settings, submit

    client = outcomes_client(settings.redis_url)
    try:
        reply_key = submit(celery_app, settings.tasks_build_queue, codebases, out, config)
        typer.echo(f"{len(codebases)} builds queued on {settings.tasks_build_queue!r}")
        yield from outcomes(client, reply_key, len(codebases), wait_s)
    except redis.RedisError as exc:
        typer.echo(
            f"error: cannot reach Redis at CSTACK_REDIS_URL ({type(exc).__name__})", err=True
        )
        raise typer.Exit(1) from None
    except TimeoutError as exc:
        typer.echo(f"error: {exc}: is a `cstack worker tasks` running?", err=True)
        raise typer.Exit(1) from None


@tasks_app.command("stats")
def stats(
    tasks: Path = typer.Option(..., "--tasks", help="An output folder of `tasks build`."),
) -> None:
    """Per codebase: candidates tried, tasks kept (and their harder variants, "+N"), and
    rejections by reason."""
    from training.rl.tasks.stats import build_stats

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
        kept = f"{row.kept} (+{row.variants} harder)" if row.variants else str(row.kept)
        typer.echo(
            f"{row.source}\t{row.baseline_passed}\t{row.candidates}\t{kept}\t"
            f"{rejected}{f' ({why})' if why else ''}"
        )
    variants, kept_total = sum(r.variants for r in rows), sum(r.kept for r in rows)
    typer.echo(f"total\t\t{sum(r.candidates for r in rows)}\t"
               f"{f'{kept_total} (+{variants} harder)' if variants else kept_total}\t"
               f"{sum(sum(r.rejected.values()) for r in rows)}")  # fmt: skip


@tasks_app.command("score")
def score(
    task: Path = typer.Option(..., "--task", help="A task folder written by `tasks build`."),
    sandbox: Path = typer.Option(..., "--sandbox", help="The edited copy of the task's repo/."),
) -> None:
    """Run the harness-owned reward: tests reset to their originals, F2P and P2P only."""
    from training.rl.rewards import task_reward
    from training.rl.tasks.scoring import evaluate_sandbox

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


@tasks_app.command("audit")
def audit(
    tasks: Path = typer.Option(..., "--tasks", help="An output folder of `tasks build`."),
    attack: list[str] = typer.Option(
        [], "--attack", help="Only this attack (repeatable); default: every one."
    ),
    limit: int = typer.Option(0, help="Audit at most this many tasks (0: all)."),
) -> None:
    """Play every known reward hack (and each task's clean solution) through the rollout
    environment: what earned reward, and what the monitor flagged. Exits 1 if any attack
    earned a reward or a clean solution did not."""
    from training.rl.tasks.attacks import ATTACKS
    from training.rl.tasks.audit import audit_task, task_ids

    known = {a.name: a for a in ATTACKS}
    unknown = [name for name in attack if name not in known]
    if unknown:
        raise typer.BadParameter(
            f"unknown attack {unknown[0]!r}; known: {', '.join(known)}", param_hint="--attack"
        )
    if limit < 0:
        raise typer.BadParameter(f"must be 0 or more, got {limit}", param_hint="--limit")
    ids = task_ids(tasks)
    if not ids:
        raise typer.BadParameter(f"{tasks} holds no task (no */task.json)", param_hint="--tasks")
    chosen = [known[name] for name in attack] or list(ATTACKS)
    failed = total = 0
    typer.echo("task\tattack\traw reward\treward\tflagged by\tverdict")
    for task_id in ids[: limit or None]:
        for row in audit_task(tasks, task_id, chosen):
            total += 1
            failed += not row.held
            verdict = "held" if row.held else ("FAILED" if row.kind != "clean" else "CLEAN FAILED")
            typer.echo(f"{task_id}\t{row.attack}\t{row.raw_reward:.3f}\t{row.reward:.3f}\t"
                       f"{','.join(row.rules) or '-'}\t{verdict}")  # fmt: skip
    typer.echo(f"{total - failed}/{total} held")
    if failed:
        raise typer.Exit(1)


def worker_tasks(
    concurrency: int = typer.Option(1, help="Codebases built in parallel (processes)."),
    loglevel: str = typer.Option("info", help="Celery log level."),
) -> None:
    """Run task-build workers: the codebases `cstack tasks build --celery` queued."""
    from training.rl.tasks.spread import celery_app
    from training.rl.work_queue import run_worker

    run_worker(celery_app, concurrency, loglevel)
