"""A throwaway copy of a task's repository, and the diff an episode made to it.

Both read what the episode's processes may have left behind, so both go through
``training.agent.trees``: no symlink followed, no FIFO or device opened, a size cap.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training.agent.trees import TreeCaps, copy_tree, read_regular, walk
from training.monitor import FileChange


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
