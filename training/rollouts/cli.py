"""`cstack worker rollouts`: a Celery worker that runs episodes and publishes trajectories."""

from __future__ import annotations

import typer


def worker_rollouts(
    concurrency: int = typer.Option(1, help="Episodes run in parallel (processes)."),
    loglevel: str = typer.Option("info", help="Celery log level."),
) -> None:
    """Run rollout workers: episodes through the policy API, trajectories to Redis."""
    from training.rollouts.worker import celery_app, settings

    celery_app.worker_main(
        [
            "worker",
            f"--concurrency={concurrency}",
            f"--loglevel={loglevel}",
            f"--queues={settings.rl_rollout_queue}",
            "--pool=prefork",
            "--without-gossip",
            "--without-mingle",
        ]
    )
