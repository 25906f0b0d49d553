"""Real gateway processes (``metered_gateway.py``: the app with billing's real Meter) on one
Redis, for the tests that race several gateways against one budget."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from serving.process import free_port
from tests.support.billing import REPO, port_open, settings_env
from tests.support.waits import wait_until

#: Run as a module from the repository root: run as a script, its folder would come first
#: on ``sys.path``, where ``tests/support/billing.py`` hides the billing package.
METERED_GATEWAY = [sys.executable, "-m", "tests.support.metered_gateway"]


def ready(port: int) -> bool:
    """Listening, and its upstream health checks have passed (/readyz)."""
    if not port_open(port):
        return False
    return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200


@contextmanager
def gateway_processes(
    values: dict[str, Any],
    upstream_url: str,
    logs: Path,
    count: int = 2,
    internal_ports: list[int] | None = None,
) -> Iterator[list[str]]:
    """``count`` gateways configured with ``values`` (CSTACK_* settings); their base URLs.
    ``internal_ports``: where each serves /metrics (free ports if not given)."""
    ports = [free_port() for _ in range(count)]
    internal = internal_ports or [free_port() for _ in range(count)]
    processes: list[subprocess.Popen[bytes]] = []
    for index, port in enumerate(ports):
        env = settings_env(
            {
                **values,
                "port": port,
                "internal_port": internal[index],
                "upstream_url": upstream_url,
            }
        )
        log = (logs / f"gateway-{index}.log").open("wb")
        processes.append(
            subprocess.Popen(
                METERED_GATEWAY, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
            )
        )
    try:
        for port in ports:  # all start at once; wait for each
            wait_until(lambda p=port: ready(p), f"the gateway on port {port} to be ready", 120)  # type: ignore[misc]
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        stop(processes)


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)  # stacks into its log, then kill it
            time.sleep(1)
            process.kill()
            process.wait(timeout=10)
            raise AssertionError("a gateway did not shut down within 30 s of SIGTERM") from None
