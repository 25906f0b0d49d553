"""A throwaway copy of a task's repository, the diff an episode made to it, and every
version of a file it held along the way.

All read what the episode's processes may have left behind, so all go through
``training.rl.agent.trees``: no symlink followed, no FIFO or device opened, a size cap.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training.rl.agent.trees import TreeCaps, TreeTooLarge, copy_tree, read_regular, walk
from training.rl.monitor import FileChange


def _text_files(root: Path, caps: TreeCaps) -> dict[str, str]:
    files: dict[str, str] = {}
    for relative, size in walk(root, caps):
        data = None if size is None else read_regular(root / relative, size)
        if data is not None:
            files[relative] = data.decode(errors="replace")
    return files


@contextmanager
def sandbox_copy(template: Path, caps: TreeCaps | None = None) -> Iterator[Path]:
    """Copy ``template`` into a fresh temp dir; the dir is removed whatever happens."""
    scratch = Path(tempfile.mkdtemp(prefix="cstack-episode-"))
    try:
        root = scratch / "repo"
        copy_tree(template, root, caps or TreeCaps())
        yield root
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def diff_trees(before: Path, after: Path, caps: TreeCaps | None = None) -> list[FileChange]:
    """Files created, deleted or changed between the template and the sandbox.

    Raises TreeTooLarge when either tree is over ``caps``.
    """
    caps = caps or TreeCaps()
    old, new = _text_files(before, caps), _text_files(after, caps)
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if old.get(path) != new.get(path):
            changes.append(FileChange(path=path, before=old.get(path), after=new.get(path)))
    return changes


class VersionLog:
    """Every version of every file a sandbox held, each against the task's own version.

    The harness records after each call that can change the tree, so the monitor also sees
    a file written and then deleted, or one the episode's code wrote while its tests ran.
    Versions are kept up to ``max_bytes`` in all; past that the log is ``overflowed`` and
    the episode earns nothing (it could otherwise hide a file among junk).
    """

    def __init__(self, template: Path, caps: TreeCaps | None = None, max_bytes: int = 64 * 1024**2):
        self.caps = caps or TreeCaps()
        self.template = _text_files(template, self.caps)
        self.max_bytes = max_bytes
        self.versions: list[FileChange] = []
        self.overflowed = False
        self._kept_bytes = 0
        self._seen: dict[str, set[str]] = {}

    def record(self, root: Path) -> None:
        try:
            files = _text_files(root, self.caps)
        except TreeTooLarge:
            self.overflowed = True
            return
        for path, text in sorted(files.items()):
            seen = self._seen.setdefault(path, set())
            if text == self.template.get(path) or text in seen:
                continue
            self._kept_bytes += len(text)
            if self._kept_bytes > self.max_bytes:
                self.overflowed = True
                return
            seen.add(text)
            self.versions.append(FileChange(path=path, before=self.template.get(path), after=text))
