"""Fetch a real codebase with its tests: a source distribution from the package index.

Sdists of many pure-Python libraries ship their test suites; wheels do not. Fetching at
build time (``pip download --no-binary :all:``) keeps third-party code out of this repo.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path


class FetchError(RuntimeError):
    """pip could not download the sdist, or the archive is not one we can unpack."""


def fetch_sdist(requirement: str, dest: Path, timeout_s: float = 300.0) -> Path:
    """Download and unpack ``requirement`` (e.g. ``toolz==1.2.0``); returns the source root."""
    downloads = Path(dest) / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
        "--disable-pip-version-check", "-d", str(downloads), requirement,
    ]  # fmt: skip
    before = set(downloads.iterdir())
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"pip download {requirement!r} failed: {tail[0]}")
    archives = sorted(set(downloads.iterdir()) - before) or sorted(downloads.iterdir())
    archive = archives[-1]
    unpacked = Path(dest) / "src"
    unpacked.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
    elif archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(unpacked)
    else:
        raise FetchError(f"{archive.name}: not an sdist archive")
    roots = [p for p in unpacked.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise FetchError(f"{archive.name}: expected one top-level folder, found {len(roots)}")
    return roots[0]
