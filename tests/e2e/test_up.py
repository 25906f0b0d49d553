"""`cstack up`: embedded Valkey, gateway and billing up, one completion per tier through the
gateway before `ready:`, and everything gone after SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from serving.process import free_port
from tests.support.commands import cstack_command

pytestmark = pytest.mark.vllm


def _read_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float) -> list[str]:
    """Lines printed until one matches; fails with everything printed if it never does."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line.rstrip("\n"))
        if re.search(pattern, line):
            return lines
    pytest.fail(f"never printed {pattern!r}; output:\n" + "\n".join(lines))


def test_up_serves_and_stops_everything(vllm_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CSTACK_VLLM_URL": vllm_url,
        "CSTACK_STATE_DIR": str(tmp_path / "state"),
        "CSTACK_GATEWAY_PORT": str(free_port()),
        "PYTHONFAULTHANDLER": "1",  # a hang's SIGABRT below prints where every thread is
    }
    env.pop("CSTACK_REDIS_URL", None)
    proc = subprocess.Popen(
        cstack_command("up", "--demo"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = _read_until(proc, r"^demo completion: ", timeout_s=600)
        shown = next(
            line.split(": ", 1)[1] for line in lines if line.startswith("embedded valkey: ")
        )
        # The printed URL hides the password; the running stack's file (0600) holds it.
        valkey_url = (tmp_path / "state" / "redis-url").read_text().strip()
        password = redis.connection.parse_url(valkey_url)["password"]
        assert password and password not in "\n".join(lines) and "***" in shown
        ready = [line for line in lines if line.startswith("ready: ")]
        assert len(ready) == 1 and ready[0].startswith("ready: http://")
        # One completion per tier went through the gateway before `ready:`.
        tier_lines = lines[: lines.index(ready[0])]
        assert any(line.startswith("fast tier ok (served by fast)") for line in tier_lines)
        assert any(line.startswith("standard tier ok (served by standard)") for line in tier_lines)
        client = redis.Redis.from_url(valkey_url)
        assert client.ping()
        client.set("cstack:test:up", "1")
        assert client.get("cstack:test:up") == b"1"
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, _ = proc.communicate(timeout=30)
            pytest.fail(f"still running 120 s after SIGTERM; its output:\n{out}")
    assert "stopped" in out
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(valkey_url, socket_connect_timeout=1).ping()
