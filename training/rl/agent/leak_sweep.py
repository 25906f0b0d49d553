"""Search everything a sandbox can read for given lines of code; print what was found.

Run inside ``training.rl.agent.isolation``'s sandbox, with the same Python view as a test run,
as ``python -I -S leak_sweep.py NEEDLES.json``. The JSON holds ``groups`` (name -> lines,
each line stripped of surrounding whitespace), ``threshold`` (name -> how many of its lines
one file must hold to count as a copy), ``modules`` (names to try importing the way a
test run would) and optionally ``roots`` (where to start; default ``/``). It walks them
without following links, skipping the kernel's file systems and the task's own tree,
reads every regular file up to a size cap (inside zip and gzip archives too, as wheels and
sdists are; ELF binaries are skipped), and prints one JSON object:
``{"copies": {name: [path, ...]}, "importable": {module: origin}, "files": N}``.

Standalone on purpose: the sandbox sees this file, not the project.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import stat
import sys
import zipfile

_SKIP = ("/proc", "/sys", "/dev", "/repo", "/run/cstack")
_MAX_BYTES = 64 * 1024**2
_MAX_PATHS = 20


def _texts(path: str, data: bytes) -> list[tuple[str, bytes]]:
    if data[:4] == b"\x7fELF":
        return []
    if data[:4] == b"PK\x03\x04":
        found = []
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for info in archive.infolist():
                    if info.file_size <= _MAX_BYTES and not info.is_dir():
                        found += _texts(f"{path}!{info.filename}", archive.read(info))
        except (zipfile.BadZipFile, OSError, RuntimeError, ValueError):
            return []
        return found
    if data[:2] == b"\x1f\x8b":
        try:
            return _texts(f"{path}!gunzip", gzip.decompress(data)[:_MAX_BYTES])
        except (OSError, EOFError, ValueError):
            return []
    if b"\x00" in data[:8192]:
        return []
    return [(path, data)]


def _files(root: str) -> list[str]:
    found, stack = [], [root]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.path in _SKIP:
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                stack.append(entry.path)
            elif stat.S_ISREG(mode):
                found.append(entry.path)
    return found


def _read(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as handle:
        if os.fstat(fd).st_size > _MAX_BYTES or not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return handle.read()


def main(needles_path: str) -> None:
    with open(needles_path) as handle:
        spec = json.load(handle)
    groups = {name: {line.encode() for line in lines} for name, lines in spec["groups"].items()}
    every = set().union(*groups.values()) if groups else set()
    copies: dict[str, list[str]] = {}
    files = [path for root in spec.get("roots", ["/"]) for path in _files(root)]
    for path in files:
        for where, data in _texts(path, _read(path)):
            lines = {line.strip() for line in data.splitlines()} & every
            if not lines:
                continue
            for name, wanted in groups.items():
                found = copies.setdefault(name, [])
                if len(lines & wanted) >= spec["threshold"][name] and len(found) < _MAX_PATHS:
                    found.append(where)
    site = spec.get("site")
    if site:
        sys.path.append(site)
    importable = {}
    for module in spec.get("modules", []):
        try:
            spec_found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec_found = None
        if spec_found is not None:
            importable[module] = spec_found.origin or "namespace package"
    copies = {name: paths for name, paths in copies.items() if paths}
    print(json.dumps({"copies": copies, "importable": importable, "files": len(files)}))


if __name__ == "__main__":
    main(sys.argv[1])
