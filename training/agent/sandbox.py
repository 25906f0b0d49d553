"""A throwaway copy of a task's repository, and the diff an episode made to it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training.monitor import FileChange


def _text_files(root: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[path.relative_to(root).as_posix()] = path.read_bytes().decode(errors="replace")
    return files


@contextmanager
def sandbox_copy(template: Path) -> Iterator[Path]:
    """Copy ``template`` into a fresh temp dir; the dir is removed whatever happens."""
    scratch = Path(tempfile.mkdtemp(prefix="cstack-episode-"))
    try:
        root = scratch / "repo"
        shutil.copytree(template, root, symlinks=False)
        yield root
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def diff_trees(before: Path, after: Path) -> list[FileChange]:
    """Files created, deleted or changed between the template and the sandbox."""
    old, new = _text_files(before), _text_files(after)
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if old.get(path) != new.get(path):
            changes.append(FileChange(path=path, before=old.get(path), after=new.get(path)))
    return changes
