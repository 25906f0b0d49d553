"""Settlements gathered for a few milliseconds and sent to Redis as one script call.

A request's settlement runs after its response has gone, so waiting a moment costs the
client nothing, while sending each alone costs the gateway a script call, a reply to read
and a task switch per request: about a tenth of a metered request's CPU. Here a
settlement waits up to ``window_s`` (or until ``max_batch`` are waiting) and goes with the
others of that moment in one call of the batch settle script, which settles each exactly
once, in order.

Each caller still awaits its own settlement: when ``submit`` returns, the usage is in
Redis; when it raises, nothing of the batch was applied (a Lua script runs whole or, on
a connection error, not at all from the caller's point of view: replay is idempotent by
the settled markers) and the caller spools its own record, as for a lone call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Record = dict[str, Any]


class SettlementQueue:
    """``await submit(record)``: the record settled together with those of the moment."""

    def __init__(
        self,
        send: Callable[[list[Record]], Awaitable[object]],
        *,
        window_s: float,
        max_batch: int = 256,
    ) -> None:
        self._send = send
        self._window_s = window_s
        self._max_batch = max_batch
        self._waiting: list[tuple[Record, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Task[None]] = set()

    async def submit(self, record: Record) -> None:
        loop = asyncio.get_running_loop()
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
        try:
            await self._send([record for record, _ in batch])
        except Exception as exc:
            for _, settled in batch:
                if not settled.done():
                    settled.set_exception(exc)
        else:
            for _, settled in batch:
                if not settled.done():
                    settled.set_result(None)

    async def aclose(self) -> None:
        """Send what is waiting now and wait for every batch in flight."""
        self._flush()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
