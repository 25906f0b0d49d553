"""Remove everything in a sandbox that could leak deleted code, and prove it is gone.

Leaks: VCS history, bytecode and tool caches, build/dist outputs (which hold packaged
copies), egg-info, virtual environments with installed copies. The canary scan reads
every remaining file's bytes (and inflates zlib/gzip payloads, as git objects and sdists
are compressed) looking for the deleted code's distinctive tokens.
"""

from __future__ import annotations

import gzip
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

LEAKY_DIRS = {
    ".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
    ".hypothesis", ".tox", ".nox", ".eggs", "build", "dist", ".venv", "venv", "site-packages",
}  # fmt: skip
LEAKY_SUFFIXES = (".pyc", ".pyo", ".egg-info", ".dist-info", ".orig", ".rej", ".whl")


@dataclass(frozen=True)
class CanaryHit:
    path: str
    canary: str


def _leaky(path: Path) -> bool:
    return (
        path.name in LEAKY_DIRS
        or path.name.endswith(LEAKY_SUFFIXES)
        or (path.is_dir() and (path / "pyvenv.cfg").exists())
    )


def scrub(sandbox: Path) -> list[str]:
    """Delete leak sources under ``sandbox``; returns what was removed (relative paths)."""
    removed: list[str] = []
    for path in sorted(sandbox.rglob("*"), key=lambda p: len(p.parts)):
        if not path.exists() and not path.is_symlink():
            continue  # inside something already removed
        if path.is_symlink():
            path.unlink()
            removed.append(str(path.relative_to(sandbox)))
        elif _leaky(path):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(str(path.relative_to(sandbox)))
    return removed


def _payloads(data: bytes) -> list[bytes]:
    found = [data]
    for inflate in (zlib.decompress, gzip.decompress):
        try:
            found.append(inflate(data))
        except (zlib.error, OSError, EOFError):
            continue
    return found


def canary_scan(sandbox: Path, canaries: list[str]) -> list[CanaryHit]:
    """Every (file, canary) where a canary's bytes occur, plus any leaky path left."""
    hits: list[CanaryHit] = []
    needles = [(c, c.encode()) for c in canaries]
    for path in sorted(sandbox.rglob("*")):
        relative = str(path.relative_to(sandbox))
        if _leaky(path):
            hits.append(CanaryHit(relative, f"<leaky path {path.name}>"))
        if not path.is_file() or path.is_symlink():
            continue
        payloads = _payloads(path.read_bytes())
        for canary, needle in needles:
            if any(needle in payload for payload in payloads):
                hits.append(CanaryHit(relative, canary))
    return hits
