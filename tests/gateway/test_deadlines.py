"""``Deadline`` never fires before its latest moment, fires once at it, and not at all
once cleared: what the read timeouts of both hops stand on. ``timeout_at`` ends every task
as ``asyncio.timeout_at`` (the reference) does: what each request's maximum duration
stands on."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import uvloop

from gateway.deadlines import Deadline, _deadlines_of, timeout_at


async def fire_times(
    moves: list[tuple[float, float | None]], wait_s: float
) -> tuple[list[float], float | None]:
    """Apply ``(after_s, seconds)`` moves (seconds None: clear), each ``after_s`` from the
    start; returns the loop times it fired at within ``wait_s``, and when it was last due
    (None: cleared last)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    fired: list[float] = []
    deadline = Deadline(loop, lambda: fired.append(loop.time()))
    due: float | None = None
    for after_s, seconds in moves:
        await asyncio.sleep(max(0.0, start + after_s - loop.time()))
        if seconds is None:
            deadline.clear()
            due = None
        else:
            due = loop.time() + seconds  # as ``set`` reckons it, in the same iteration
            deadline.set(seconds)
    await asyncio.sleep(max(0.0, start + wait_s - loop.time()))
    deadline.cancel()
    return fired, due


def test_a_moment_moved_later_is_waited_for() -> None:
    fired, due = uvloop.run(fire_times([(0.0, 0.05), (0.03, 0.2)], wait_s=0.5))
    assert due is not None and len(fired) == 1 and fired[0] >= due  # not where its handle was


def test_a_moment_moved_sooner_fires_sooner() -> None:
    fired, due = uvloop.run(fire_times([(0.0, 5.0), (0.0, 0.05)], wait_s=0.5))
    assert due is not None and len(fired) == 1 and due <= fired[0] < due + 4.9


def test_a_cleared_deadline_does_not_fire_and_can_be_set_again() -> None:
    assert uvloop.run(fire_times([(0.0, 0.05), (0.01, None)], wait_s=0.2)) == ([], None)
    fired, due = uvloop.run(fire_times([(0.0, 0.05), (0.01, None), (0.1, 0.05)], wait_s=0.4))
    assert due is not None and len(fired) == 1 and fired[0] >= due


def test_moves_on_the_plain_asyncio_loop_too() -> None:
    fired, due = asyncio.run(fire_times([(0.0, 0.05), (0.02, 0.1), (0.04, 0.1)], wait_s=0.5))
    assert due is not None and len(fired) == 1 and fired[0] >= due


# --- timeout_at: asyncio.timeout_at's behaviour on one handle per loop ------------------


class _OneHandle:
    """``timeout_at`` entered as ``asyncio.timeout_at`` is (``async with``), so one
    scenario runs on both."""

    def __init__(self, when: float) -> None:
        self._timeout = timeout_at(when)

    async def __aenter__(self) -> None:
        self._timeout.__enter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        self._timeout.__exit__(*exc_info)


def asyncio_timeout_reference(when: float) -> AbstractAsyncContextManager[Any]:
    return asyncio.timeout_at(when)


TIMEOUTS = [asyncio_timeout_reference, _OneHandle]


async def outcomes(make: Callable[[float], AbstractAsyncContextManager[Any]]) -> list[str]:
    """Tasks under deadlines that come due out of the order they were set: some end in time,
    some time out, one nests a shorter deadline in a longer one, one is cancelled from
    elsewhere too as its deadline expires, one waits on a deadline already past; how each
    ended, and whether any expired before its moment."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    release = asyncio.Event()
    expired_early: list[str] = []

    async def under(name: str, after_s: float, ends: bool) -> str:
        when = start + after_s
        try:
            async with make(when):
                if ends:
                    await release.wait()
                    return f"{name}: ended"
                await asyncio.sleep(60)
        except TimeoutError:
            if loop.time() < when - 0.002:
                expired_early.append(name)
            return f"{name}: timed out"
        except asyncio.CancelledError:
            return f"{name}: cancelled"
        return f"{name}: ?"

    async def nested() -> str:
        async with make(start + 30):
            try:
                async with make(start + 0.03):
                    await asyncio.sleep(60)
            except TimeoutError:
                pass
            await asyncio.sleep(0.02)  # the outer one still holds, and is not expired
            return "nested: inner timed out, outer ended"

    cancelled_too = asyncio.Event()

    async def cancelled_as_it_expires() -> str:
        try:
            async with make(start + 0.04):
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled_too.set()
                    await asyncio.sleep(60)  # cancelled again, from elsewhere, here
            return "both: ?"
        except TimeoutError:
            return "both: timed out"
        except asyncio.CancelledError:
            return "both: cancelled"

    names = [f"t{i}" for i in range(12)]
    shorts = [0.02 * (i + 1) for i in range(6)]
    random.Random(7).shuffle(shorts)
    tasks = [
        asyncio.create_task(under(name, shorts[i // 2] if i % 2 else 30 + i, ends=i % 2 == 0))
        for i, name in enumerate(names)
    ]
    tasks.append(asyncio.create_task(under("past", -1.0, ends=False)))
    tasks.append(asyncio.create_task(nested()))
    both = asyncio.create_task(cancelled_as_it_expires())
    release.set()
    await cancelled_too.wait()
    both.cancel()
    ended = [*await asyncio.gather(*tasks), await both]
    return [*ended, f"expired early: {expired_early}"]


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_timeout_at_ends_each_task_as_asyncio_timeout_at_does(run: Callable[..., Any]) -> None:
    expected = run(outcomes(asyncio_timeout_reference))
    assert expected[-1] == "expired early: []"
    assert expected.count("both: cancelled") == 1 and "past: timed out" in expected
    assert run(outcomes(_OneHandle)) == expected


def test_timeout_at_leaves_no_deadline_behind() -> None:
    async def many() -> int:
        loop = asyncio.get_running_loop()
        for index in range(1000):
            with timeout_at(loop.time() + 30 - index % 7):  # out of order
                await asyncio.sleep(0)
        with pytest.raises(TimeoutError), timeout_at(loop.time() + 0.01):
            await asyncio.sleep(60)
        return len(_deadlines_of(loop).pending)

    assert uvloop.run(many()) == 0


def test_timeout_at_outside_a_task_is_refused() -> None:
    async def in_a_callback() -> None:
        loop = asyncio.get_running_loop()
        failed: asyncio.Future[BaseException] = loop.create_future()

        def enter() -> None:
            try:
                timeout_at(loop.time() + 1).__enter__()
            except RuntimeError as exc:
                failed.set_result(exc)

        loop.call_soon(enter)
        assert "inside a task" in str(await failed)

    uvloop.run(in_a_callback())


async def first_wait_after(when_from_now: float | None) -> str:
    """How a block under a deadline ends when its task yields once (``sleep(0)``)."""
    loop = asyncio.get_running_loop()
    try:
        with timeout_at(None if when_from_now is None else loop.time() + when_from_now):
            await asyncio.sleep(0)
    except TimeoutError:
        return "timed out"
    return "ended"


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_timeout_at_past_expires_at_the_first_wait_and_none_never(run: Callable[..., Any]) -> None:
    assert run(first_wait_after(-1.0)) == "timed out"  # as asyncio's does, by call_soon
    assert run(first_wait_after(None)) == "ended"
    assert run(first_wait_after(30.0)) == "ended"


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_timeout_at_never_expires_before_its_moment(run: Callable[..., Any]) -> None:
    """Deadlines a fraction of a millisecond apart (uvloop's timers count milliseconds, and
    one handle serves them all): each block sees its own moment passed when it times out;
    a deadline of None beside them never expires and leaves the others working."""

    async def lateness() -> list[float]:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.01
        seen: list[float] = []

        async def one(when: float | None) -> None:
            try:
                with timeout_at(when):
                    await asyncio.sleep(0.5 if when is None else 60)
            except TimeoutError:
                assert when is not None
                seen.append(loop.time() - when)

        await asyncio.gather(one(None), *(one(start + i * 0.0001) for i in range(40)))
        return seen

    seen = run(lateness())
    assert len(seen) == 40 and min(seen) >= 0


def test_timeout_at_is_entered_once() -> None:
    async def twice() -> None:
        timeout = timeout_at(asyncio.get_running_loop().time() + 30)
        with timeout:
            pass
        with pytest.raises(RuntimeError, match="already been entered"), timeout:
            pass

    uvloop.run(twice())
