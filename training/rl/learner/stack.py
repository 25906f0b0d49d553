"""The processes `cstack rl` starts for a session: one vLLM engine with its RL endpoints on,
and rollout workers. Each is a ``serving.process.ManagedProcess`` (its own process group),
stopped as a group when the session's ``ExitStack`` closes. Valkey is ``serving.valkey``'s
(``running_valkey``: password-protected, its URL carries the password to the workers).

The engine listens on 127.0.0.1 only: its dev endpoints (weight reload) are not behind
vLLM's API key, so no other machine may reach them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from serving.engine import engine_for_variant
from serving.process import ManagedProcess, free_port


def start_engine(
    stack: ExitStack,
    model: Path,
    log_dir: Path,
    timeout_s: float,
    api_key: str | None = None,
    on_progress: Callable[[str, float, Path], None] | None = None,
) -> str:
    """vLLM on the shared variant with weight sync on (dev endpoints and the worker
    extension for exact in-place weight reload: serving's ``weight_sync`` section).

    ``api_key``: what the engine then requires on ``/v1/*`` (default: serving's
    CSTACK_VLLM_API_KEY, unset: none); the weight push and the rollout workers must send it.
    ``on_progress(phase, seconds, log)`` hears, about twice a second while the engine
    starts, the phase its log shows and the seconds since it was started.
    """
    server = engine_for_variant(
        "shared",
        model,
        free_port(),
        log_path=log_dir / "vllm.log",
        host="127.0.0.1",
        weight_sync=True,
        api_key=api_key,
    )
    started = time.monotonic()
    server.start()
    stack.callback(server.stop)

    def report() -> None:
        if on_progress is not None:
            phase = server.phase() or "importing vLLM"
            on_progress(phase, time.monotonic() - started, server.log_path)

    server.wait_healthy(timeout_s=timeout_s, on_poll=report)
    return server.base_url


def start_workers(stack: ExitStack, env: dict[str, str], count: int, log_dir: Path) -> None:
    """Rollout workers as separate processes, as in production (`cstack worker rollouts`)."""
    for index in range(count):
        own = dict(env)
        if "CSTACK_RL_METRICS_PORT" in env:  # one /metrics port per worker process
            own["CSTACK_RL_METRICS_PORT"] = str(int(env["CSTACK_RL_METRICS_PORT"]) + index)
        worker = ManagedProcess(
            f"rollout worker {index}",
            [sys.executable, "-m", "celery", "-A", "training.rl.rollouts.worker:celery_app",
             "worker", "--concurrency=1", "--pool=prefork", "--without-gossip",
             "--without-mingle", "--loglevel=info", f"-Q{env['CSTACK_RL_ROLLOUT_QUEUE']}",
             f"--hostname=rollouts{index}@%h"],
            log_dir / f"rollout-worker-{index}.log",
            env=own,
        )  # fmt: skip
        worker.start()
        stack.callback(worker.stop)
