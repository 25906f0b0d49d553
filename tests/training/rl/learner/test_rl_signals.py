"""`cstack rl` run for real and stopped by SIGTERM (what Kubernetes, systemd and `timeout`
send) to its own PID alone: it stops every process it started (Valkey, vLLM, the rollout
worker) before it exits. On the way, its output through a pipe and where its state goes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.commands import cstack_command
from tests.support.waits import wait_until


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent PID, start time) of a process from /proc; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return fields[0], int(fields[1]), int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every live process below ``root``, as PID -> start time (so a reused PID is told
    apart from the process that had it)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            state, parent, start = stat
            if state != "Z":
                children.setdefault(parent, []).append(int(entry.name))
                started[int(entry.name)] = start
    found: dict[int, int] = {}
    below = list(children.get(root, []))
    while below:
        pid = below.pop()
        found[pid] = started[pid]
        below.extend(children.get(pid, []))
    return found


def _alive(pid: int, start: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and stat[2] == start


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class _Lines:
    """What a child writes to its stdout pipe, line by line, read as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: Iterator[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def any(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.lines)

    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.mark.vllm
def test_sigterm_stops_everything_cstack_rl_started(tiny_model: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    rl = subprocess.Popen(
        cstack_command("rl", "--model", str(tiny_model), "--steps", "1000", "--group-size", "2",
                       "--groups-per-step", "1", "--max-tokens", "8", "--heartbeat-s", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "CSTACK_STATE_DIR": str(state)},
        start_new_session=True,  # as under a supervisor: nothing shares our process group
    )  # fmt: skip
    output = _Lines(rl)
    started: dict[int, int] = {}
    try:
        # A finished step: Valkey, vLLM and the rollout worker are all up and working.
        wait_until(
            lambda: output.any("step 1/1000: reward ") or rl.poll() is not None,
            "cstack rl's first step",
            timeout_s=900,
            interval_s=0.5,
        )
        assert rl.poll() is None, output.text()
        started = _descendants(rl.pid)
        commands = " ".join(_command_line(pid) for pid in started)
        for child in ("valkey-server", "vllm", "celery"):
            assert child in commands, f"no {child} among the children: {commands}"

        rl.send_signal(signal.SIGTERM)  # to the command alone, not its process group
        assert rl.wait(timeout=120) == 128 + signal.SIGTERM, output.text()
        wait_until(
            lambda: not any(_alive(pid, start) for pid, start in started.items()),
            "every process cstack rl started to stop",
            timeout_s=60,
            interval_s=0.2,
        )
    finally:
        if rl.poll() is None:
            rl.kill()
        for pid, start in started.items():  # never leak them, whatever failed above
            if _alive(pid, start):
                os.kill(pid, signal.SIGKILL)
        rl.wait()

    text = output.text()
    assert f"stopped (SIGTERM); step reports in {state / 'rl' / 'steps.jsonl'}" in text
    # Piped: vLLM's phases, the run's phases, then the steps, each on a line of its own.
    assert output.any("vLLM: ") and output.any("cstack rl: building the trainer")
    # The state went under CSTACK_STATE_DIR, as `cstack up`'s does.
    reports = (state / "rl" / "steps.jsonl").read_text().splitlines()
    assert reports and json.loads(reports[0])["step"] == 1
    assert (state / "rl" / "logs" / "vllm.log").stat().st_size > 0
    assert (state / "rl" / "logs" / "rollout-worker-0.log").stat().st_size > 0
