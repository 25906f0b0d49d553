"""ManagedProcess and stop signals: a stop while waiting on a child cleans up, no hang."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.process import ManagedProcess, ServerStartError

SUPERVISOR = """
import sys
from serving.process import ManagedProcess, StopRequested, stop_signals_raise
child = ManagedProcess("sleeper", ["sleep", "600"], sys.argv[1])
try:
    with stop_signals_raise():
        child.start()
        print(child.process.pid, flush=True)
        child.process.wait()
except StopRequested as stop:
    code = stop.exit_code
finally:
    child.stop()
sys.exit(code)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_while_waiting_on_the_child_stops_it(tmp_path: Path) -> None:
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert supervisor.stdout is not None
    child_pid = int(supervisor.stdout.readline())
    time.sleep(0.5)  # let it block inside Popen.wait()
    supervisor.send_signal(signal.SIGTERM)
    # Before the fix the handler's own wait deadlocked on Popen's lock: this would hang.
    assert supervisor.wait(timeout=30) == 128 + signal.SIGTERM
    assert not _alive(child_pid)


def test_child_dying_during_start_names_the_cause(tmp_path: Path) -> None:
    script = "import sys; print('ValueError: the config is broken'); sys.exit(3)"
    child = ManagedProcess(
        "broken", [sys.executable, "-c", script], tmp_path / "log", "http://127.0.0.1:9/health"
    )
    child.start()
    with pytest.raises(ServerStartError, match=r"status 3 during start: ValueError: the config"):
        child.wait_healthy(timeout_s=60)
