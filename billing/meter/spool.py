"""A local, fsync'd spool for usage events while Redis is unreachable.

Each gateway process appends to its own file; any process may replay any file once Redis
is back. A replayer claims a file by renaming it, so two replayers never read the same
lines, and a writer re-opens when the file it locked was renamed under it, so no line is
written into a file that is already being replayed. Replay is at-least-once (a crash
between sending and unlinking resends lines); the settle script and the ledger dedupe
by request id.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

SUFFIX = ".jsonl"
CLAIMED = ".replaying"

logger = logging.getLogger(__name__)


class UsageSpool:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / f"{socket.gethostname()}-{os.getpid()}{SUFFIX}"

    def append(self, record: dict[str, Any]) -> None:
        """Durably append one record (the write is on disk when this returns)."""
        self.append_all([record])

    def append_all(self, records: Sequence[dict[str, Any]]) -> None:
        """Durably append records in one write (on disk when this returns)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        line = b"".join(
            (json.dumps(record, separators=(",", ":")) + "\n").encode() for record in records
        )
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    os.write(fd, line)
                    os.fsync(fd)
                    return
            finally:
                os.close(fd)
            # A replayer renamed the file between our open and our lock: write anew.

    def pending_files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.name.endswith((SUFFIX, CLAIMED)))

    def pending_count(self) -> int:
        count = 0
        for path in self.pending_files():
            try:
                # Complete lines only: a torn last line (no newline) was never accepted.
                count += path.read_bytes().count(b"\n")
            except FileNotFoundError:
                continue
        return count

    def _claim(self, path: Path) -> Path | None:
        if path.name.endswith(CLAIMED):
            return path  # left by a replayer that died; replaying it again is safe
        claimed = path.with_name(f"{path.name}.{os.getpid()}{CLAIMED}")
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None
        # Wait for a writer that locked the old name before the rename to finish.
        fd = os.open(claimed, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)
        return claimed

    async def replay(self, send: Callable[[dict[str, Any]], Awaitable[None]]) -> int:
        """Send every spooled record; a file is removed only after all of it was sent.

        If ``send`` raises (Redis went away again) the rest stays on disk for next time.
        """
        sent = 0
        for path in self.pending_files():
            claimed = self._claim(path)
            if claimed is None:
                continue
            try:
                lines = claimed.read_bytes().splitlines()
            except FileNotFoundError:
                continue  # another replayer finished it
            for line in lines:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    # A line torn by a crash mid-write was never fsync'd, so never
                    # acknowledged to anyone: it is not an accepted event.
                    logger.warning("skipping a torn line in usage spool %s", claimed)
                    continue
                await send(record)
                sent += 1
            claimed.unlink(missing_ok=True)
        return sent
