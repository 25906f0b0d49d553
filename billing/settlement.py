"""Settlements gathered for a few milliseconds and sent to Redis as one script call.

A request's settlement runs after its response has gone, so waiting a moment costs the
client nothing, while sending each alone costs the gateway a script call, a reply to read
and a task switch per request: about a tenth of a metered request's CPU. Here a
settlement waits up to ``window_s`` (or until ``max_batch`` are waiting) and goes with the
others of that moment in one call of ``send``.

``send`` owns what happens to a batch: it returns one outcome per record (None: settled,
or spooled to be replayed; an exception: that record's own failure), and it must not
raise. So a record is never lost with its caller: one that stopped waiting (cancelled)
is sent, or spooled, all the same. Each caller still awaits its own outcome; after
``aclose`` a record is sent at once, alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Record = dict[str, Any]
Outcome = BaseException | None
SendBatch = Callable[[list[Record]], Awaitable[Sequence[Outcome]]]


class SettlementQueue:
    """``await submit(record)``: the record settled together with those of the moment."""

    def __init__(self, send: SendBatch, *, window_s: float, max_batch: int = 256) -> None:
        self._send = send
        self._window_s = window_s
        self._max_batch = max_batch
        self._waiting: list[tuple[Record, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._closed = False

    async def submit(self, record: Record) -> None:
        loop = asyncio.get_running_loop()
        if self._closed:
            outcome = (await self._send([record]))[0]
            if outcome is not None:
                raise outcome
            return
        if loop is not self._loop:  # a new event loop: nothing of the old one can run
            self._loop, self._timer, self._waiting = loop, None, []
        settled: asyncio.Future[None] = loop.create_future()
        self._waiting.append((record, settled))
        if len(self._waiting) >= self._max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._window_s, self._flush)
        # A caller that gives up cancels only its future: its record is sent all the same.
        await settled

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = self._waiting, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send_batch(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _send_batch(self, batch: list[tuple[Record, asyncio.Future[None]]]) -> None:
        outcomes = await self._send([record for record, _ in batch])
        for (_, settled), outcome in zip(batch, outcomes, strict=True):
            if settled.done():  # its caller stopped waiting
                continue
            if outcome is None:
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
