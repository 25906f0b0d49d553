"""Settlements gathered for a few milliseconds and sent to Redis as one script call.

A request's settlement runs after its response has gone, so waiting a moment costs the
client nothing, while sending each alone costs the gateway a script call, a reply to read
and a task switch per request: about a tenth of a metered request's CPU. Here a
settlement waits up to ``window_s`` (or until ``max_batch`` are waiting) and goes with the
others of that moment in one call of ``send``.

``send`` owns what happens to a batch: it returns one outcome per record (None: settled,
or spooled to be replayed; an exception: that record's own failure), and it must not
raise. So a record is never lost with its caller: one that stopped waiting (cancelled)
is sent, or spooled, all the same. A caller awaits its own outcome (``submit``) or hands
the record over and goes on (``submit_nowait``: the gateway, whose client already has its
answer); the failure of a record nobody waits for goes to ``unawaited``. After ``aclose``
a record is sent at once, alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

Record = dict[str, Any]
Outcome = BaseException | None
SendBatch = Callable[[list[Record]], Awaitable[Sequence[Outcome]]]
Unawaited = Callable[[Record, BaseException], None]
#: A record made when its batch goes (None: nothing to send, its maker said why). It must
#: not raise: it runs inside the batch, whose other records would go with it.
Deferred = Callable[[], Record | None]
Waiting = tuple[Record | Deferred, "asyncio.Future[None] | None"]


class SettlementQueue:
    """``await submit(record)``: the record settled together with those of the moment;
    ``submit_nowait(record)``: the same, without waiting for it."""

    def __init__(
        self, send: SendBatch, *, window_s: float, unawaited: Unawaited, max_batch: int = 256
    ) -> None:
        self._send = send
        self._window_s = window_s
        self._unawaited = unawaited
        self._max_batch = max_batch
        self._waiting: list[Waiting] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._closed = False

    async def submit(self, record: Record) -> None:
        """The record settled with those of the moment; raises its own failure."""
        if self._closed:
            outcome = (await self._send([record]))[0]
            if outcome is not None:
                raise outcome
            return
        settled: asyncio.Future[None] = self._running_loop().create_future()
        self._enqueue(record, settled)
        # A caller that gives up cancels only its future: its record is sent all the same.
        await settled

    def submit_nowait(self, record: Record | Deferred) -> None:
        """Hand the record over: it goes with those of the moment (after ``aclose``, at
        once, alone), and its failure, if any, to ``unawaited``. A ``Deferred`` is made
        into its record when its batch goes: the work of a moment's records done
        together, off the requests' own turns, costs less than each done in its own."""
        if self._closed:
            self._start(self._send_batch([(record, None)]))
        else:
            self._enqueue(record, None)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the caller runs on (the queue is used from one thread, where one loop
        runs at a time). Not asked of ``asyncio.get_running_loop()`` while the queue's own
        loop runs: it makes a ``getpid`` system call each time, per settlement."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = asyncio.get_running_loop()
            # A new event loop: nothing of the old one can run.
            self._loop, self._timer, self._waiting = loop, None, []
        return loop

    def _enqueue(self, record: Record | Deferred, settled: asyncio.Future[None] | None) -> None:
        loop = self._running_loop()
        self._waiting.append((record, settled))
        if len(self._waiting) >= self._max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._window_s, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = self._waiting, []
        if batch:
            self._start(self._send_batch(batch))

    def _start(self, sending: Coroutine[Any, Any, None]) -> None:
        task = self._running_loop().create_task(sending)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _send_batch(self, waiting: list[Waiting]) -> None:
        batch: list[tuple[Record, asyncio.Future[None] | None]] = []
        for record, settled in waiting:
            made = record() if callable(record) else record
            if made is not None:
                batch.append((made, settled))
        outcomes = await self._send([record for record, _ in batch]) if batch else []
        for (record, settled), outcome in zip(batch, outcomes, strict=True):
            if settled is None or settled.done():  # nobody waits for it (any more)
                if outcome is not None:
                    self._unawaited(record, outcome)
            elif outcome is None:
                settled.set_result(None)
            else:
                settled.set_exception(outcome)

    async def aclose(self) -> None:
        """Send what is waiting now and wait for every batch in flight; from now on each
        record goes at once."""
        self._closed = True
        if self._waiting:
            self._flush()
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
