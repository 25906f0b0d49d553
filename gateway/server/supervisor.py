"""``cstack gateway --workers N`` (N > 1): a supervisor that runs N worker processes and
serves no request itself (a worker's side is ``gateway.server.workers``).

- Connections: the supervisor accepts on the public port and hands each connection (its
  file descriptor, over a Unix socket) to the ready worker holding the fewest open ones;
  workers report each close. Left to the kernel, a few keep-alive connections opened
  together (a client's pool) split unevenly: a shared socket lets whichever worker wakes
  first accept a whole burst (measured: all 8 of 8 connections on one worker in 15 of 20
  bursts), SO_REUSEPORT hashes them (7 and 1 seen). The supervisor does one accept and
  one send per connection, nothing per request. The internal port (/metrics, /admin/) is
  one socket every worker listens on: any worker can answer it.
- Metrics: prometheus_client's multiprocess mode in a directory made fresh for each start
  (removed at exit), so every worker's /metrics renders every worker's samples
  (gateway/metrics.py). The variable is set before any worker imports prometheus_client,
  which decides the mode on import: the reason workers are fresh interpreters, not forks.
- State: keys, budgets, rate limits and revocations already live in Redis. What each
  process holds alone is divided: each worker gets its share of every engine's slots
  (engine admission, gateway/app.py) and of the Redis-down admission allowance, so the
  gateway as a whole keeps to the configured figures.
- SIGTERM or SIGINT: the supervisor stops accepting and sends every worker SIGTERM; each
  drains as a single gateway does (CSTACK_SHUTDOWN_GRACE_S), and the supervisor then ends
  as a single gateway does, terminated by the same signal.
- A worker that dies after it was ready is restarted (same index, same shares; its open
  connections are lost, as they would be with one process). One that dies before it was
  ready stops the whole gateway with status 1: its start failed, and another would fail
  the same way. Workers get SIGTERM if the supervisor dies (Linux).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from types import FrameType

from gateway.server.workers import CLOSED, READY
from gateway.settings import GatewaySettings

logger = logging.getLogger("uvicorn.error")

#: Set in every worker's environment: prometheus_client's multiprocess directory.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: How often the supervisor looks at its workers (a stop signal interrupts the wait).
POLL_S = 0.2
#: A worker still running this long after the stop's grace is killed.
KILL_MARGIN_S = 10.0
WORKER_ENTRY = "from gateway.server.workers import run_worker; run_worker()"
#: Connections accepted per wake-up at most, so the supervisor also sees its workers.
ACCEPT_BATCH = 64


class ListenError(Exception):
    """A listener could not be bound (the message says which and why)."""


def bind_supervisor_listeners(settings: GatewaySettings) -> tuple[socket.socket, socket.socket]:
    """The public socket (the supervisor accepts on it) and the internal one (the workers)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    listeners: list[socket.socket] = []
    for port in (settings.port, settings.internal_port):
        try:
            listeners.append(
                socket.create_server((settings.host, port), family=family, backlog=2048)
            )
        except OSError as exc:
            for sock in listeners:
                sock.close()
            reason = os.strerror(exc.errno) if exc.errno else exc
            raise ListenError(f"cannot listen on {settings.host}:{port}: {reason}") from None
    return listeners[0], listeners[1]


@dataclass(eq=False)
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    #: The supervisor's end of the worker's channel (a Unix SOCK_SEQPACKET pair).
    channel: socket.socket
    #: It has said it serves (it stays so once said: a worker that dies after is restarted).
    ready: bool = False
    #: Its channel is open: it can be handed connections (once ready).
    connected: bool = True
    #: It replaces one that died.
    restarted: bool = False
    #: Connections handed to it and not yet closed; handed ever (breaks ties in turn).
    open: int = 0
    handed: int = 0


class Supervisor:
    """Runs ``settings.gateway_workers`` worker processes (see the module docstring)."""

    def __init__(self, settings: GatewaySettings, env: dict[str, str]) -> None:
        self.settings = settings
        #: The workers' environment: the supervisor's, plus its command line's settings.
        self.env = env
        self.workers: dict[int, _Worker] = {}
        self.stop_signal: int | None = None
        self.selector = selectors.DefaultSelector()
        self._public: socket.socket | None = None
        self._internal: socket.socket | None = None
        self._accepting = False

    def run(self) -> int:
        """Serve until a stop signal (then end by that signal, as uvicorn does) or until a
        worker fails to start (then return 1)."""
        self._public, self._internal = bind_supervisor_listeners(self.settings)
        self._public.setblocking(False)
        metrics_dir = tempfile.mkdtemp(prefix="cstack-gateway-metrics-")
        self.env = {**self.env, MULTIPROC_DIR_ENV: metrics_dir}
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            code = self._supervise(metrics_dir)
        finally:
            self._stop_all()
            shutil.rmtree(metrics_dir, ignore_errors=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.stop_signal is not None:
            signal.signal(self.stop_signal, signal.SIG_DFL)
            signal.raise_signal(self.stop_signal)
        return code

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.stop_signal = sig

    def _start(self, index: int) -> _Worker:
        assert self._internal is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = (self._internal.fileno(), theirs.fileno())
        command = [sys.executable, "-c", WORKER_ENTRY, str(index), str(os.getpid()), *map(str, fds)]
        try:
            process = subprocess.Popen(
                command, env=self.env, pass_fds=fds, stdin=subprocess.DEVNULL
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        worker = _Worker(index, process, ours)
        self.workers[index] = worker
        self.selector.register(ours, selectors.EVENT_READ, worker)
        return worker

    def _supervise(self, metrics_dir: str) -> int:
        from prometheus_client import multiprocess

        for index in range(self.settings.gateway_workers):
            self._start(index)
        announced = False
        while self.stop_signal is None:
            for key, _ in self.selector.select(POLL_S):
                if key.data is None:
                    self._accept()
                else:
                    self._read_channel(key.data)
            for worker in list(self.workers.values()):
                status = worker.process.poll()
                if status is None or self.stop_signal is not None:
                    continue
                self._forget(worker)
                pid = worker.process.pid
                if not worker.ready:
                    logger.error(
                        "gateway worker %d (pid %d) exited with status %s before it was "
                        "ready; stopping the gateway",
                        worker.index,
                        pid,
                        status,
                    )
                    return 1
                logger.warning(
                    "gateway worker %d (pid %d) exited with status %s; restarting it",
                    worker.index,
                    pid,
                    status,
                )
                # Its live gauges (in-flight requests) end with it; its counters stay.
                multiprocess.mark_process_dead(pid, metrics_dir)
                self._start(worker.index).restarted = True
            # Connections wait in the backlog until a worker can take them.
            self._accept_while(any(w.ready and w.connected for w in self.workers.values()))
            if not announced and all(w.ready for w in self.workers.values()):
                announced = True
                assert self._public is not None
                logger.info(
                    "gateway serving on port %d with %d workers",
                    self._public.getsockname()[1],
                    len(self.workers),
                )
        return 0

    def _accept_while(self, accepting: bool) -> None:
        if accepting != self._accepting and self._public is not None:
            if accepting:
                self.selector.register(self._public, selectors.EVENT_READ, None)
            else:
                self.selector.unregister(self._public)
            self._accepting = accepting

    def _accept(self) -> None:
        assert self._public is not None
        for _ in range(ACCEPT_BATCH):
            try:
                connection, _ = self._public.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors, a connection reset meanwhile
                logger.warning("accept failed: %s", exc)
                return
            with connection:
                self._hand(connection)

    def _hand(self, connection: socket.socket) -> None:
        """To the ready worker with the fewest open connections (this process's copy of the
        connection is closed by the caller)."""
        ready = [w for w in self.workers.values() if w.ready and w.connected]
        for worker in sorted(ready, key=lambda w: (w.open, w.handed)):
            try:
                socket.send_fds(worker.channel, [b"n"], [connection.fileno()])
            except OSError:  # its channel is full (a stuck worker) or gone: the next one
                continue
            worker.open += 1
            worker.handed += 1
            return
        logger.warning("no worker could take a connection; closing it")

    def _read_channel(self, worker: _Worker) -> None:
        while True:
            try:
                message = worker.channel.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:  # it exited: the supervisor's loop sees its status next
                self._forget(worker)
                return
            if message == READY:
                worker.ready = True
                if worker.restarted:
                    logger.info(
                        "gateway worker %d (pid %d) restarted, serving",
                        worker.index,
                        worker.process.pid,
                    )
            worker.open = max(0, worker.open - message.count(CLOSED))

    def _forget(self, worker: _Worker) -> None:
        if not worker.connected:
            return
        worker.connected = False
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(worker.channel)
        worker.channel.close()

    def _stop_all(self) -> None:
        self._accept_while(False)
        for sock in (self._public, self._internal):
            if sock is not None:
                sock.close()
        running = [w for w in self.workers.values() if w.process.poll() is None]
        for worker in running:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_grace_s + KILL_MARGIN_S
        for worker in running:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("gateway worker %d did not stop; killing it", worker.index)
                worker.process.kill()
                worker.process.wait()
        for worker in self.workers.values():
            self._forget(worker)
        self.selector.close()


def supervise(settings: GatewaySettings, env: dict[str, str]) -> int:
    import logging.config

    from uvicorn.config import LOGGING_CONFIG

    # The workers log through uvicorn's configuration; the supervisor's lines look alike.
    logging.config.dictConfig(LOGGING_CONFIG)
    logger.setLevel(settings.log_level.upper())
    return Supervisor(settings, env).run()
