"""``Deadline`` never fires before its latest moment, fires once at it, and not at all
once cleared: what the read timeouts of both hops stand on."""

from __future__ import annotations

import asyncio

import uvloop

from gateway.deadlines import Deadline


async def fired_at(deadline_moves: list[tuple[float, float | None]], wait_s: float) -> list[float]:
    """Apply ``(at, seconds)`` moves (seconds None: clear) at loop times ``at`` from now;
    returns the loop times it fired at, relative to the start, within ``wait_s``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    fired: list[float] = []
    deadline = Deadline(loop, lambda: fired.append(loop.time() - start))
    for at, seconds in deadline_moves:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        if seconds is None:
            deadline.clear()
        else:
            deadline.set(seconds)
    await asyncio.sleep(max(0.0, start + wait_s - loop.time()))
    deadline.cancel()
    return fired


def test_a_moment_moved_later_is_waited_for() -> None:
    fired = uvloop.run(fired_at([(0.0, 0.05), (0.03, 0.2)], wait_s=0.5))
    assert len(fired) == 1 and fired[0] >= 0.23  # not at 0.05, where its handle was


def test_a_moment_moved_sooner_fires_sooner() -> None:
    fired = uvloop.run(fired_at([(0.0, 5.0), (0.0, 0.05)], wait_s=0.5))
    assert len(fired) == 1 and 0.05 <= fired[0] < 5.0


def test_a_cleared_deadline_does_not_fire_and_can_be_set_again() -> None:
    assert uvloop.run(fired_at([(0.0, 0.05), (0.01, None)], wait_s=0.2)) == []
    fired = uvloop.run(fired_at([(0.0, 0.05), (0.01, None), (0.1, 0.05)], wait_s=0.4))
    assert len(fired) == 1 and fired[0] >= 0.15


def test_moves_on_the_plain_asyncio_loop_too() -> None:
    fired = asyncio.run(fired_at([(0.0, 0.05), (0.02, 0.1), (0.04, 0.1)], wait_s=0.5))
    assert len(fired) == 1 and fired[0] >= 0.14
