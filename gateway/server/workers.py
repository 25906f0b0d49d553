"""What one gateway process serves (``build_app``), and a worker's side of
``cstack gateway --workers N``.

The gateway's request path runs on one event loop, so one process uses one core at most.
With N workers the ``cstack gateway`` process becomes a supervisor (``gateway.server.supervisor``)
that runs N worker processes, fresh interpreters started on ``run_worker``. A worker serves
as a single gateway does, on the connections its supervisor hands it over a Unix socket
(``HandedConnections``), and says on that channel when it is ready and when each
connection closes. It gets its share of what each process holds alone: every engine's
slots (engine admission, gateway/app.py) and the Redis-down admission allowance. A worker
gets SIGTERM if its supervisor dies (Linux), so none is left serving.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import sys
from typing import Any

from gateway.settings import GatewaySettings
from gateway.upstream.slot_policy import share

#: Worker to supervisor, on its channel: it serves now; one handed connection closed.
READY, CLOSED = b"r", b"c"


def build_app(settings: GatewaySettings, worker: int = 0) -> Any:
    """The app one gateway process serves: billing's meter (unless CSTACK_BILLING is off),
    the usage reader, the org customers' record, the Stripe webhook. ``worker`` is this
    process's index among ``settings.gateway_workers``: it gets that share of what each
    process holds alone."""
    import billing.contract as billing
    from billing.contract import (
        BillingAccounts,
        BillingSettings,
        Meter,
        UnbilledAccounts,
        UnmeteredMeter,
        UnmeteredUsageReader,
        UsageReader,
    )
    from gateway.app import create_app

    meter: Meter = UnmeteredMeter()
    usage: UsageReader = UnmeteredUsageReader()
    accounts: BillingAccounts = UnbilledAccounts()
    if settings.billing:
        billing_settings = BillingSettings().model_copy(update={"redis_url": settings.redis_url})
        workers = settings.gateway_workers
        if workers > 1:
            # The allowance is per gateway (a pod): each process admits its part of it.
            billing_settings = billing_settings.model_copy(
                update={
                    "redis_down_allowance_nano_usd": share(
                        billing_settings.redis_down_allowance_nano_usd, worker, workers
                    ),
                    "redis_down_allowance_requests": share(
                        billing_settings.redis_down_allowance_requests, worker, workers
                    ),
                }
            )
        meter = billing.create_meter(billing_settings)
        usage = billing.create_usage_reader(billing_settings)
        accounts = billing.create_accounts(billing_settings)
    app = create_app(settings, meter, usage, accounts=accounts, worker=worker)
    if settings.billing:
        from billing.contract import stripe_webhook_router

        app.include_router(stripe_webhook_router())
    return app


def freeze_and_serve(
    app: Any,
    settings: GatewaySettings,
    sockets: list[socket.socket] | None = None,
    channel: socket.socket | None = None,
) -> None:
    """Serve ``app`` until SIGTERM/SIGINT: on ``sockets`` (else newly bound listeners),
    and, as a worker, on the connections its supervisor hands it over ``channel``."""
    import uvicorn

    from gateway.server.listeners import bind_listeners, server_config

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and channel is not None:
                self.handed = HandedConnections(channel, self)
                self.handed.start()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if channel is not None and self.started:
                self.handed.stop()
            await super().shutdown(sockets)

    prepare_heap_for_serving()
    Server(server_config(app, settings)).run(sockets=sockets or bind_listeners(settings))


#: Tracked objects allocated, net of those freed, that start a collection of the youngest
#: generation (CPython's default: 700). A metered gateway reached 700 every ten requests or
#: so: billing's batches (the admissions of a moment in one write, the settlements of a
#: few milliseconds in one call) keep a moment's objects alive together and free them
#: together, and each collection then walked every live request's coroutines and frames,
#: about 150 us: 15-20 us of CPU per metered request, against 1 us with billing off
#: (measured at saturation, ``bench/RESULTS.md``). What a steady load allocates it frees,
#: so it never reaches 10,000; garbage only a collection can free (cycles: an exception
#: and its traceback) still starts one once that much of it has piled up.
GC_YOUNG_THRESHOLD = 10_000


def prepare_heap_for_serving() -> None:
    """Set the collector up for a process that is about to serve requests, its start done."""
    # Everything allocated so far (modules, the app) lives as long as the process. Left
    # in the collector's care, every full collection walks it: 40-60 ms pauses measured
    # under load, which were the gateway's p99. Frozen, collections see request garbage only.
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class HandedConnections:
    """A worker's end of its channel: connections from the supervisor in, served as if the
    worker had accepted them; a notice out for each that closes."""

    def __init__(self, channel: socket.socket, server: Any) -> None:
        self.channel = channel
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.unsent = 0
        #: The tasks wiring up connections (the loop keeps only weak references to tasks).
        self.tasks: set[asyncio.Task[None]] = set()
        config = server.config
        handed = self

        class HandedProtocol(config.http_protocol_class):  # type: ignore[name-defined,misc]
            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                handed.closed()

        self.protocol_class = HandedProtocol

    def start(self) -> None:
        self.channel.setblocking(False)
        self.loop.add_reader(self.channel.fileno(), self._receive)
        self.channel.send(READY)

    def stop(self) -> None:
        # Shutting down: no new connections (the supervisor has stopped accepting too).
        self.loop.remove_reader(self.channel.fileno())

    def _protocol(self) -> Any:
        # As uvicorn's own factory builds it (uvicorn.Server.startup).
        return self.protocol_class(
            config=self.server.config,
            server_state=self.server.server_state,
            app_state=self.server.lifespan.state,
            _loop=self.loop,
        )

    def _receive(self) -> None:
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(self.channel, 16, 16)
            except BlockingIOError:
                return
            except OSError:
                fds = []
            if not fds:  # the supervisor is gone: SIGTERM follows (PR_SET_PDEATHSIG)
                self.stop()
                return
            for fd in fds:
                task = self.loop.create_task(self._serve(socket.socket(fileno=fd)))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _serve(self, connection: socket.socket) -> None:
        connection.setblocking(False)
        try:
            await self.loop.connect_accepted_socket(self._protocol, connection)
        except OSError:  # the client went away before its transport was set up
            connection.close()
            self.closed()

    def closed(self) -> None:
        try:
            self.channel.send(CLOSED * (1 + self.unsent))
            self.unsent = 0
        except BlockingIOError:
            self.unsent += 1  # the supervisor is behind: tell it with the next one
        except OSError:
            pass


def run_worker() -> None:
    """A worker's main: ``WORKER_ENTRY INDEX SUPERVISOR_PID INTERNAL_FD CHANNEL_FD``."""
    index, supervisor, internal_fd, channel_fd = map(int, sys.argv[1:5])
    _exit_with(supervisor)
    # From the environment; mypy does not read the fields' positional Field() defaults.
    settings = GatewaySettings()  # type: ignore[call-arg]
    app = build_app(settings, worker=index)
    channel = socket.socket(fileno=channel_fd)
    freeze_and_serve(app, settings, [socket.socket(fileno=internal_fd)], channel)


def _exit_with(supervisor: int) -> None:
    """SIGTERM this worker when the supervisor dies (Linux), so none is left serving."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before prctl took effect
        sys.exit(1)
