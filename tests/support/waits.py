"""Polling until something is true, with a deadline and a message saying what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any], what: str, timeout_s: float = 60.0, interval_s: float = 0.05
) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g}s waiting for {what}"
        time.sleep(interval_s)
