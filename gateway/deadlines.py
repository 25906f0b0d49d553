"""Timers on the hot path, each on one timer handle.

``Deadline``: a callback due at a moment that moves often.

A connection's read timeout moves with every read, and a request's head and body
timeouts several times a request. Cancelling a timer and making another at each move
costs a heap entry and a handle per move (per streamed read, upstream); here the handle
stays, and is made again only when it fires early (the moment moved later) or must fire
sooner than it would.

``timeout_at(when)``: ``asyncio.timeout_at``'s behaviour for a request's deadline, one
handle for all of a loop's requests. Every relayed request runs under its maximum duration
(``max_request_duration_s``, half an hour by default), and nearly every one ends long before
it. ``asyncio.timeout_at`` makes and cancels a handle per use and enters through two
coroutines: 4.6 us a use under uvloop on the 2-core machines here, against 0.9 for this one;
a streamed request has two (its relay and its end's grace). Here a use joins its loop's set
of pending deadlines and leaves it; one handle, armed at the earliest deadline it has seen,
fires rarely: it expires what is due and re-arms at the earliest of the rest (a pass over
the requests in flight, about once a maximum duration). A plain ``with``: nothing in
entering or leaving waits. Expiring is ``asyncio.timeout_at``'s: the task is cancelled (at
its next wait, for a deadline already past; never before the deadline otherwise), and the
cancellation leaves the block as ``TimeoutError`` unless the task was also cancelled from
elsewhere (``tests/gateway/test_deadlines.py`` holds it to ``asyncio.timeout_at``).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from operator import attrgetter
from types import TracebackType


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


class _LoopDeadlines:
    """The pending deadlines of one event loop, and the one handle that watches them."""

    __slots__ = ("armed", "handle", "loop", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: set[timeout_at] = set()
        self.handle: asyncio.TimerHandle | None = None
        #: When the handle fires (infinity: no handle).
        self.armed = math.inf

    def add(self, timeout: timeout_at) -> None:
        self.pending.add(timeout)
        when = timeout.when
        if when <= self.loop.time():
            # Due already: cancelled at the task's next wait, as asyncio's call_soon does.
            self.loop.call_soon(self._expire_now, timeout)
        elif when < self.armed:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.armed = when
        self.handle = self.loop.call_at(when, self._fire)

    def _expire_now(self, timeout: timeout_at) -> None:
        if timeout in self.pending:
            self.pending.discard(timeout)
            timeout.expire()

    def _fire(self) -> None:
        # Never before a deadline's moment: uvloop's timers count milliseconds and may fire
        # up to one early, and a handle that finds nothing due is armed again.
        self.handle, self.armed = None, math.inf
        now = self.loop.time()
        due = sorted((timeout for timeout in self.pending if timeout.when <= now), key=_WHEN)
        for timeout in due:
            self.pending.discard(timeout)
            timeout.expire()
        if self.pending:
            self._arm(min(timeout.when for timeout in self.pending))


_WHEN = attrgetter("when")
#: Each running loop's deadlines (tests run several loops in turn, in threads too;
#: production one). Read without the lock; changed only under it.
_LOOPS: dict[asyncio.AbstractEventLoop, _LoopDeadlines] = {}
_LOOPS_CHANGING = threading.Lock()


def _deadlines_of(loop: asyncio.AbstractEventLoop) -> _LoopDeadlines:
    deadlines = _LOOPS.get(loop)
    if deadlines is None:
        with _LOOPS_CHANGING:
            for stale in [each for each in list(_LOOPS) if each.is_closed()]:
                del _LOOPS[stale]
            deadlines = _LOOPS[loop] = _LoopDeadlines(loop)
    return deadlines


class timeout_at:  # lowercase: it stands in for asyncio.timeout_at at its call sites
    """Cancel the current task at loop time ``when`` (None: never) unless the block has
    ended; the block then raises ``TimeoutError``. Entered once, as asyncio's."""

    __slots__ = ("_cancelling", "_deadlines", "_expired", "_task", "when")

    def __init__(self, when: float | None) -> None:
        self.when = math.inf if when is None else when
        self._expired = False
        self._deadlines: _LoopDeadlines | None = None

    def __enter__(self) -> timeout_at:
        if self._deadlines is not None:
            raise RuntimeError("timeout_at has already been entered")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout_at must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._deadlines = _deadlines_of(task.get_loop())
        self._deadlines.add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._deadlines is not None
        self._deadlines.pending.discard(self)
        if (
            self._expired
            and self._task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    def expire(self) -> None:
        """Due: cancel the task (its block turns the cancellation into ``TimeoutError``)."""
        self._expired = True
        self._task.cancel()
