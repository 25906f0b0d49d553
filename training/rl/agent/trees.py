"""Read and copy file trees that untrusted code wrote, without trusting what is in them.

An episode's sandbox can hold anything its tests' processes created: symlinks (to ``/``,
to the harness's files), FIFOs (opening one for reading blocks forever), sockets, device
nodes, and more bytes than the harness should hold. So every walk here uses ``lstat``
and never follows a symlink, only regular files are ever opened (with ``O_NOFOLLOW`` and
``O_NONBLOCK``, and checked again on the open descriptor, so one that became a FIFO or
a link since the walk is skipped), everything else is skipped, and a tree over its caps
is refused as a whole instead of copied in part.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class TreeTooLarge(ValueError):
    """The tree has more files or bytes than its caps allow."""


@dataclass(frozen=True)
class TreeCaps:
    """Bounds on one tree: its entries (files and directories) and its files' bytes."""

    max_entries: int = 20_000
    max_bytes: int = 256 * 1024**2


def walk(root: Path, caps: TreeCaps) -> list[tuple[str, int | None]]:
    """(relative POSIX path, size) under ``root``, sorted; size None marks a directory.

    Only real directories are entered and only regular files are listed: symlinks, FIFOs,
    sockets and devices are skipped. Raises TreeTooLarge once the walk passes a cap.
    """
    total = 0
    pending = [Path(root)]
    found: list[tuple[str, int | None]] = []
    while pending:
        directory = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                relative = Path(entry.path).relative_to(root).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                    found.append((relative, None))
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    total += size
                    found.append((relative, size))
                if len(found) > caps.max_entries or total > caps.max_bytes:
                    raise TreeTooLarge(
                        f"{root} holds over {caps.max_entries} entries or {caps.max_bytes} bytes"
                    )
    return sorted(found)


def read_regular(path: Path, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``path`` if it is (still) a regular file, else None."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None  # a symlink by now (ELOOP), gone, or unreadable
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        remaining = limit
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1024**2))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def copy_tree(source: Path, target: Path, caps: TreeCaps) -> None:
    """Copy the directories and regular files of ``source`` into a new ``target``.

    Files keep their execute bits (a script stays runnable), not their owner or times.
    Raises TreeTooLarge, before writing anything, when ``source`` is over its caps.
    """
    entries = walk(source, caps)
    target.mkdir(parents=True)
    for relative, size in entries:
        copy = target / relative
        if size is None:
            copy.mkdir(exist_ok=True)
            continue
        data = read_regular(source / relative, size)
        if data is not None:
            copy.write_bytes(data)
            executable = os.lstat(source / relative).st_mode & 0o111
            copy.chmod(0o644 | executable)
