"""``Deadline`` never fires before its latest moment, fires once at it, and not at all
once cleared: what the read timeouts of both hops stand on."""

from __future__ import annotations

import asyncio

import uvloop

from gateway.deadlines import Deadline


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
