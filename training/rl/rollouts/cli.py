"""`cstack worker rollouts`: a Celery worker that runs episodes and publishes trajectories."""

from __future__ import annotations

import typer


def worker_rollouts(
    concurrency: int = typer.Option(1, help="Episodes run in parallel (processes)."),
    loglevel: str = typer.Option("info", help="Celery log level."),
) -> None:
    """Run rollout workers: episodes through the policy API, trajectories to Redis."""
    from training.rl.rollouts.worker import celery_app
    from training.rl.work_queue import run_worker

    run_worker(celery_app, concurrency, loglevel)
