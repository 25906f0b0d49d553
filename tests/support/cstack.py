"""The `cstack` CLI as the tests run it."""

from __future__ import annotations

import sys


def cstack_command(*args: str) -> list[str]:
    """The `cstack` CLI as this interpreter runs it (no reliance on PATH)."""
    return [sys.executable, "-m", "deploy.cli", *args]
