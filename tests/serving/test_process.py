"""ManagedProcess and stop signals: a stop while waiting on a child cleans up, no hang;
free ports no client connection can take."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.process import ManagedProcess, ServerStartError, free_port

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


# The signal lands while the main thread runs code that swallows what it raises: a
# finalizer run by the garbage collector (as the openai SDK's client's, which closes its
# connections inside `except Exception`), or a library's own `except Exception`.
SWALLOWED = """
import gc, os, signal, sys, threading, time
from serving.process import StopRequested, stop_signals_raise

class ClosedByTheCollector:
    def __init__(self):
        self.cycle = self
    def __del__(self):
        try:
            time.sleep(0.5)
        except Exception:
            pass

def library_call():
    try:
        time.sleep(0.5)
    except Exception:
        pass

threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
try:
    with stop_signals_raise() as stop_signals:
        if sys.argv[1] == "finalizer":
            ClosedByTheCollector()
            gc.collect()
        else:
            library_call()
        print("went on", flush=True)
        for _ in range(100):
            stop_signals.raise_if_received()
            time.sleep(0.1)
except StopRequested as stop:
    sys.exit(stop.exit_code)
sys.exit(0)
"""


@pytest.mark.parametrize("swallowed_by", ["finalizer", "library"])
def test_a_stop_whose_raise_was_swallowed_still_stops(swallowed_by: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SWALLOWED, swallowed_by],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    # A finalizer drops any exception, so only the wait loop's check stops that one; an
    # `except Exception` no longer catches StopRequested (a BaseException) at all.
    assert ("went on" in done.stdout) == (swallowed_by == "finalizer")


def test_free_ports_are_below_the_range_outgoing_connections_take_theirs_from() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(low // 2 <= port < low for port in ports)
    # A connection's own port comes from the range, never one of those.
    with socket.create_server(("127.0.0.1", 0)) as server:
        connections = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            assert not ports & {c.getsockname()[1] for c in connections}
            assert all(c.getsockname()[1] >= low for c in connections)
        finally:
            for connection in connections:
                connection.close()
    with socket.create_server(("127.0.0.1", free_port())):  # and it binds
        pass
