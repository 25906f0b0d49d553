"""The Celery apps of training's workers (rollouts, task builds): made and run one way.

Their jobs are long (an episode, a codebase's whole build) and must not be lost, so each
is acknowledged only once done: a job whose worker process dies is handed back at once by
the worker that ran it, and one whose whole worker is gone is delivered again after
``redeliver_s`` without an acknowledgement, by the next sweep of any live worker. A
worker process takes one job at a time (no prefetching ahead of a long one).
"""

from __future__ import annotations

from celery import Celery


def work_queue_app(
    name: str, broker: str, queue: str, *, redeliver_s: int, **conf: object
) -> Celery:
    """An app whose jobs go to ``queue`` on ``broker``; ``conf``: Celery settings on top."""
    app = Celery(name, broker=broker)
    app.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": redeliver_s,
            # kombu sweeps for overdue jobs every 10 s but scans only every 10th sweep: a
            # job could wait 100 s past its timeout. Every sweep scans (one sorted-set
            # range read), at least every redeliver_s / 4.
            "unacked_restore_interval": max(1, min(10, redeliver_s // 4)),
            "unacked_restore_throttle": 1,
        },
        **conf,
    )
    return app


def run_worker(app: Celery, concurrency: int, loglevel: str) -> None:
    """Run a worker of ``app`` on its queue in this process, with ``concurrency`` children."""
    app.worker_main(
        [
            "worker",
            f"--concurrency={concurrency}",
            f"--loglevel={loglevel}",
            f"--queues={app.conf.task_default_queue}",
            "--pool=prefork",
            "--without-gossip",
            "--without-mingle",
        ]
    )
