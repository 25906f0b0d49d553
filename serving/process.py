"""Child processes: started, health-checked and stopped as one group; free ports for them.

vLLM (and Celery) start processes of their own, so every child is put in a new process
group: stopping it means signalling the whole group, the only way to leave no orphaned
engine behind when the parent is asked to stop. `cstack serve`, `cstack up` and `cstack rl`
start their children here; the embedded Valkey they share is ``serving.valkey``.

A new process group, not a new session: Linux gives every session a scheduling group of
its own (autogroup, on by default), and the CPU scheduler then shares a core between
groups before tasks. vLLM's CPU worker keeps its core busy, and with the engine in a
session of its own every other process woken on that core (the gateway, Redis, a client)
waited behind it for up to 5 s at a time on a 2-core machine (measured with ``perf sched``:
the gateway's upstream connects and Redis reads then timed out). In the caller's session
they are all one group and share the cores task by task.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx

# Lines in a log that name why a start failed, most specific first.
_CAUSE_PATTERNS = [
    re.compile(r"\b(?:\w+\.)*\w*(?:Error|Exception): .+"),
    re.compile(r"(?i)\berror\b[:\]].+"),
]


#: Where the OS says its ephemeral ports are (Linux).
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now; it stays free only until someone
    binds it, so bind it soon.

    Picked at random below the OS's ephemeral range: the OS gives every outgoing connection
    a port from that range, so a port from it (what binding port 0 gives) may be taken by
    any client's connection before its server binds it ("Address already in use", seen in
    CI). Where no range is known, or nothing below it binds, the OS picks.
    """
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(32 if low > 2048 else 0):
        port = random.randrange(low // 2, low)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerStartError(RuntimeError):
    """The child exited or never became healthy; the message names the likely cause."""


class ManagedProcess:
    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        health_url: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        # Progress: how far into the log this run's start has been read, and the phase
        # the last line that named one began.
        self._log_read_to = 0
        self._phase: str | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # The log is appended to across runs: phases come from this run's lines only.
            self._log_read_to = log.tell()
            self._phase = None
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                process_group=0,  # not a new session: see the module docstring
            )

    def wait_healthy(self, timeout_s: float, on_poll: Callable[[], None] | None = None) -> None:
        """Block until the health URL answers 200 (or, without one, until the child has
        survived its first second); raise naming the cause if the child dies first.

        ``on_poll`` runs between polls (about twice a second): where a caller shows progress.
        """
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if on_poll is not None:
                    on_poll()
                code = self.process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"{self.name} exited with status {code} during start: "
                        f"{self.failure_cause()} (log: {self.log_path})"
                    )
                if self.health_url is None:
                    time.sleep(1.0)
                    if self.process.poll() is None:
                        return
                    continue
                try:
                    if client.get(self.health_url).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"{self.name} did not become healthy within {timeout_s:.0f}s (log: {self.log_path})"
        )

    def phase(self) -> str | None:
        """What the child is doing while it starts, from the lines it has logged since
        ``start()`` (see ``phase_of``); None until one of them names a phase."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_read_to)
                new = log.read()
        except OSError:
            return self._phase
        # Only whole lines: the child may be halfway through writing the last one.
        complete = new[: new.rfind(b"\n") + 1]
        self._log_read_to += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            self._phase = self.phase_of(line) or self._phase
        return self._phase

    def phase_of(self, line: str) -> str | None:
        """The start phase a log line begins, if it begins one. A subclass that knows its
        child's log says (``serving.launcher.VllmServer``); by default no line does."""
        return None

    def failure_cause(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-400:]
        except OSError:
            return "no log written"
        for pattern in _CAUSE_PATTERNS:
            for line in reversed(lines):
                match = pattern.search(line)
                if match:
                    return match.group(0).strip()
        return lines[-1].strip() if lines else "no output"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after ``grace_s``."""
        if self.process is None:
            return
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            self.process.wait()
        # Grandchildren (engine workers) can outlive the leader by a moment.
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class StopRequested(BaseException):
    """SIGTERM or SIGINT arrived; raised from the signal handler to unwind to cleanup.

    A BaseException, like KeyboardInterrupt: the handler runs wherever the main thread
    happens to be, and a library's ``except Exception`` there must not swallow the stop.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


class StopSignals:
    """The stop signals received inside a :func:`stop_signals_raise` block.

    The handler's raise can still be lost: Python drops what a finalizer (``__del__``)
    raises, and the garbage collector runs finalizers wherever the main thread allocates
    (the openai SDK's client closes its connections in one, inside ``except Exception``).
    A `cstack up` signalled while that ran kept running, its one SIGTERM gone. Loops that
    wait call :meth:`raise_if_received` each round, so a stop lost that way still lands.
    """

    def __init__(self) -> None:
        self.received: list[int] = []

    def raise_if_received(self) -> None:
        if self.received:
            raise StopRequested(self.received[0])


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[StopSignals]:
    """Turn SIGTERM/SIGINT into ``StopRequested`` inside the block, and ignore them after it.

    Doing the cleanup in the handler itself is not safe: the main thread may be inside
    ``Popen.wait``, whose lock is not re-entrant, so a second wait from the handler
    deadlocks. Raising unwinds the interrupted wait first. Once the block is left (for
    the caller's ``finally`` cleanup), further signals are ignored so that a second
    Ctrl-C cannot abandon a half-stopped child. Yields the signals received, for loops
    that must not miss a stop whose raise was swallowed (:class:`StopSignals`).
    """
    signals = StopSignals()

    def _raise(signum: int, _frame: object) -> None:
        signals.received.append(signum)
        raise StopRequested(signum)

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)
    try:
        yield signals
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
