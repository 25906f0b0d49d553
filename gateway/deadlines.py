"""``Deadline``: a callback due at a moment that moves often, on one timer handle.

A connection's read timeout moves with every read, and a request's head and body
timeouts several times a request. Cancelling a timer and making another at each move
costs a heap entry and a handle per move (per streamed read, upstream); here the handle
stays, and is made again only when it fires early (the moment moved later) or must fire
sooner than it would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    __slots__ = ("_at", "_callback", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
        self._loop = loop
        self._callback = callback
        #: When ``callback`` is due (loop time), None when it is not.
        self._at: float | None = None
        self._handle: asyncio.TimerHandle | None = None

    def set(self, seconds: float) -> None:
        """Due ``seconds`` from now (instead of whenever it was)."""
        at = self._loop.time() + seconds
        self._at = at
        handle = self._handle
        if handle is None or handle.when() > at:
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(at, self._fire)

    def clear(self) -> None:
        """Not due (the handle, if any, fires to find nothing to do)."""
        self._at = None

    def cancel(self) -> None:
        """Not due, and no handle left (its owner is going away)."""
        self._at = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        at = self._at
        if at is None:
            return
        if self._loop.time() < at:
            self._handle = self._loop.call_at(at, self._fire)
            return
        self._at = None
        self._callback()
