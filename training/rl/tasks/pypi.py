"""Fetch a real codebase with its tests: a source distribution from the package index.

Sdists of many pure-Python libraries ship their test suites; wheels do not. Fetching at
build time (``pip download --no-binary :all:``) keeps third-party code out of this repo.
A pinned requirement's archive (``NAME==VERSION``) is kept in a local cache after the
first download, and later builds unpack it from there without asking the index.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

#: Only these are cached: an unpinned requirement may name another release tomorrow. The
#: characters allowed keep the requirement usable as a folder name inside the cache.
PINNED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9._+!-]*")


class FetchError(RuntimeError):
    """pip could not download the sdist, or the archive is not one we can unpack."""


def fetch_sdist(
    requirement: str, dest: Path, cache: Path | None = None, timeout_s: float = 300.0
) -> Path:
    """Download and unpack ``requirement`` (e.g. ``toolz==1.2.0``) under ``dest``; returns
    the source root. With ``cache``, a pinned requirement's archive is taken from there if
    an earlier fetch kept it, and kept there after a download."""
    archive = _cached(cache, requirement)
    if archive is None:
        archive = _download(requirement, Path(dest) / "downloads", timeout_s)
        _keep(cache, requirement, archive)
    return _unpack(archive, Path(dest) / "src")


def _cache_folder(cache: Path | None, requirement: str) -> Path | None:
    if cache is None or not PINNED.fullmatch(requirement):
        return None
    return Path(cache) / requirement


def _cached(cache: Path | None, requirement: str) -> Path | None:
    folder = _cache_folder(cache, requirement)
    if folder is None or not folder.is_dir():
        return None
    # A copy still being written is a dot file (``_keep``), never taken for the archive.
    archives = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    return archives[0] if len(archives) == 1 else None


def _keep(cache: Path | None, requirement: str, archive: Path) -> None:
    """Copy ``archive`` into the cache; concurrent builds each write a copy of their own and
    rename it into place. A cache that cannot be written costs a download next time, not
    this build."""
    folder = _cache_folder(cache, requirement)
    if folder is None:
        return
    partial = folder / f".{archive.name}.{uuid.uuid4().hex}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(archive, partial)
        os.replace(partial, folder / archive.name)
    except OSError as exc:
        logger.warning("sdist cache %s not written (%s); next time it is downloaded", folder, exc)
        partial.unlink(missing_ok=True)


def _download(requirement: str, downloads: Path, timeout_s: float) -> Path:
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
    return archives[-1]


def _unpack(archive: Path, unpacked: Path) -> Path:
    unpacked.mkdir(parents=True, exist_ok=True)
    try:
        if archive.name.endswith((".tar.gz", ".tgz")):
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")
        elif archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as zipped:
                zipped.extractall(unpacked)
        else:
            raise FetchError(f"{archive.name}: not an sdist archive")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise FetchError(f"{archive} cannot be unpacked: {exc}") from None
    roots = [p for p in unpacked.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise FetchError(f"{archive.name}: expected one top-level folder, found {len(roots)}")
    return roots[0]
