"""Polling until something is true, with a deadline and a message saying what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], what: str, timeout_s: float = 60.0, interval_s: float = 0.05
) -> T:
    """``predicate()``'s first true value; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g}s waiting for {what}"
        time.sleep(interval_s)
    return value
