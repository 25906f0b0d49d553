"""What Python a sandbox sees: the interpreter, its standard library, named distributions.

A machine holds copies of a task's deleted code in many places: the interpreter's own
site-packages, the system's Debian Python packages, the virtualenv's distributions, code
vendored inside pip, setuptools or a cloud SDK, wheels bundled with ``ensurepip``. A
sandbox that mounted whole prefixes handed every one of them to the policy, which could
look the answer up instead of writing it. So the sandbox gets an allow-list:

* the interpreter's executable and shared library, and its standard library with the
  directories that hold third-party code inside it (``site-packages``, ``dist-packages``,
  ``ensurepip``'s bundled wheels) shown empty;
* of the rest of the system, only what a process needs to start: ``/usr/bin`` and the
  shared-library directories (``/usr/lib/<multiarch>``, ``/usr/lib64``), not ``/usr/lib``'s
  other trees, ``/usr/share`` or ``/usr/local``;
* the distributions a run needs (pytest and what it requires, plus a task's declared
  dependencies and theirs), each top-level module mounted on its own under
  :data:`SITE_DIR`, nothing else of the site-packages they came from.

What stays readable can still hold a copy (the standard library has ``tomllib``, a copy of
tomli); the task builder sweeps the sandbox for each deleted feature's lines and refuses
any it finds (``training.rl.tasks.leaks``).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

#: Where the allowed distributions' modules appear inside the sandbox.
SITE_DIR = "/opt/cstack/site-packages"
#: What every test run needs: pytest and, through its requirements, pluggy, iniconfig and
#: packaging.
RUNNER_DISTRIBUTIONS = ("pytest",)
#: Directories inside the standard library that hold third-party code, shown empty.
_STDLIB_HIDDEN = ("site-packages", "dist-packages", "ensurepip/_bundled")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")


class MissingDistribution(LookupError):
    """A distribution a run needs is not installed where the harness runs."""


@dataclass(frozen=True)
class Bind:
    """A host path shown read-only at ``target`` inside the sandbox."""

    source: str
    target: str


@dataclass(frozen=True)
class PythonRuntime:
    """The read-only view of Python a sandbox gets (see the module docstring)."""

    #: The interpreter, at the same path inside as outside.
    interpreter: str
    binds: tuple[Bind, ...]
    #: Directories inside ``binds`` shown as empty, read-only directories.
    hidden: tuple[str, ...]
    #: The distributions under :data:`SITE_DIR` (canonical names, sorted).
    distributions: tuple[str, ...]
    #: The top-level module names those distributions provide.
    modules: frozenset[str]


def canonical(name: str) -> str:
    """A distribution name as the packaging specification compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def interpreter_path() -> str:
    """The real interpreter behind this process (a virtualenv's python is a link to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _requirements(dist: metadata.Distribution, extras: Iterable[str]) -> Iterator[Requirement]:
    environments = [{"extra": ""}, *({"extra": extra} for extra in extras)]
    for raw in dist.requires or ():
        try:
            requirement = Requirement(raw)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is None or any(marker.evaluate(env) for env in environments):
            yield requirement


def closure(names: Iterable[str]) -> list[metadata.Distribution]:
    """``names`` and everything they require (markers evaluated here), each once.

    Raises MissingDistribution for any that is not installed.
    """
    found: dict[str, metadata.Distribution] = {}
    pending: list[tuple[str, tuple[str, ...]]] = [(name, ()) for name in names]
    while pending:
        raw, extras = pending.pop()
        try:
            requirement = Requirement(raw)
            name, extras = requirement.name, (*extras, *requirement.extras)
        except InvalidRequirement:
            name = raw
        key = canonical(name)
        if key in found and not extras:
            continue
        try:
            dist = found.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise MissingDistribution(f"distribution {name!r} is not installed") from None
        found[key] = dist
        pending += [(str(r.name), tuple(r.extras)) for r in _requirements(dist, extras)]
    return [found[key] for key in sorted(found)]


def top_level_entries(dist: metadata.Distribution) -> dict[str, Path]:
    """Each top-level file or folder a distribution installed, by name: its modules and
    its metadata folder, never a ``.pth`` startup hook or a script outside site-packages."""
    entries: dict[str, Path] = {}
    for file in dist.files or ():
        head = file.parts[0] if file.parts else ""
        if head in ("", "..", "__pycache__") or head.endswith(".pth") or ":" in head:
            continue
        located = Path(str(dist.locate_file(head)))
        if located.exists():
            entries[head] = located
    if not entries:
        raise MissingDistribution(f"distribution {dist.metadata['Name']!r} lists no files")
    return entries


def module_name(entry: str) -> str:
    """The importable name a top-level site-packages entry provides ('' for metadata)."""
    if entry.endswith((".dist-info", ".egg-info", ".data")):
        return ""
    return entry.split(".", 1)[0]


def _system_binds() -> list[Bind]:
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = ["/usr/bin", f"/usr/lib/{multiarch}" if multiarch else "", "/usr/lib64"]
    binds = [Bind(d, d) for d in dirs if d and Path(d).is_dir()]
    return binds + [Bind(f, f) for f in _SYSTEM_FILES if Path(f).is_file()]


def _interpreter_binds() -> tuple[list[Bind], list[str]]:
    interpreter = interpreter_path()
    binds = [Bind(interpreter, interpreter)]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        soname = sysconfig.get_config_var("INSTSONAME") or ""
        shared = os.path.realpath(os.path.join(libdir, soname))
        if libdir and soname and Path(shared).is_file():
            binds.append(Bind(shared, os.path.join(libdir, soname)))
    stdlib = sysconfig.get_paths()["stdlib"]
    binds.append(Bind(stdlib, stdlib))
    hidden = [os.path.join(stdlib, d) for d in _STDLIB_HIDDEN if Path(stdlib, d).is_dir()]
    return binds, hidden


@functools.lru_cache(maxsize=64)
def _runtime(distributions: tuple[str, ...]) -> PythonRuntime:
    binds, hidden = _interpreter_binds()
    binds += _system_binds()
    names: list[str] = []
    modules: set[str] = set()
    mounted: dict[str, str] = {}
    for dist in closure(distributions) if distributions else []:
        names.append(canonical(dist.metadata["Name"]))
        for entry, path in top_level_entries(dist).items():
            if mounted.setdefault(entry, str(path)) == str(path):
                modules.add(module_name(entry))
    binds += [Bind(source, f"{SITE_DIR}/{entry}") for entry, source in sorted(mounted.items())]
    modules.discard("")
    return PythonRuntime(
        interpreter=interpreter_path(),
        binds=tuple(binds),
        hidden=tuple(hidden),
        distributions=tuple(sorted(names)),
        modules=frozenset(modules),
    )


def python_runtime(distributions: Sequence[str] = ()) -> PythonRuntime:
    """The view for a run that needs ``distributions`` (and what they require); with none,
    the interpreter and its standard library alone. Raises MissingDistribution."""
    return _runtime(tuple(sorted(set(distributions))))


def pytest_runtime(declared: Sequence[str] = ()) -> PythonRuntime:
    """The view a pytest run gets: the runner's distributions plus ``declared``."""
    return python_runtime([*RUNNER_DISTRIBUTIONS, *declared])
