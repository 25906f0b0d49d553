"""Which files of a repository are source, which are tests, where imports resolve."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from training.rl.tasks.scrub import LEAKY_DIRS, LEAKY_SUFFIXES

TEST_FILE = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_test\.py$|(^|/)conftest\.py$")
PYTEST_CONFIG = (
    "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
    "pyproject.toml",
)  # fmt: skip
#: Files Python or pytest runs or reads on their own when found: a conftest, the
#: interpreter's startup hooks on the module path, pytest's configuration.
STARTUP_FILES = ("conftest.py", "sitecustomize.py", "usercustomize.py", *PYTEST_CONFIG)
#: Not the library: documentation, examples, and packaging scripts (``ez_setup.py``
#: downloads setuptools and rewrites ``sys.meta_path``; no test of the library covers it).
_NOT_SOURCE = re.compile(
    r"(^|/)(docs?|examples?|benchmarks?|scripts)/|"
    r"(^|/)(setup|noxfile|ez_setup|distribute_setup|versioneer|fabfile)\.py$"
)


@dataclass(frozen=True)
class RepoLayout:
    """Relative paths: importable sources, test + pytest-config files, sys.path roots."""

    source_files: list[str]
    test_files: list[str]
    python_paths: list[str]


def _skipped(relative: Path) -> bool:
    return any(part in LEAKY_DIRS or part.endswith(LEAKY_SUFFIXES) for part in relative.parts)


def is_test_file(relative: str) -> bool:
    return bool(TEST_FILE.search(relative)) or relative in PYTEST_CONFIG


def runs_at_startup(relative: str) -> bool:
    """A file that changes a test run by merely existing, wherever it is in the tree."""
    return relative.rsplit("/", 1)[-1] in STARTUP_FILES


def discover(repo: Path) -> RepoLayout:
    python_paths = ["src"] if (repo / "src").is_dir() else ["."]
    sources: list[str] = []
    tests: list[str] = [name for name in PYTEST_CONFIG if (repo / name).is_file()]
    for path in sorted(repo.rglob("*.py")):
        relative = path.relative_to(repo)
        if _skipped(relative):
            continue
        text = relative.as_posix()
        if TEST_FILE.search(text):
            tests.append(text)
        elif not _NOT_SOURCE.search(text):
            sources.append(text)
    return RepoLayout(sources, tests, python_paths)


#: Module names the scorer and its bootstrap are loaded under inside the sandbox.
HARNESS_MODULES = frozenset({"cstack_report", "pytest_bootstrap", "leak_sweep"})
_MODULE_SUFFIXES = (".py", ".pyc", ".pyd", ".so", ".pth")


def shadowing_paths(files: Iterable[str], protected: Collection[str]) -> set[str]:
    """The files among ``files`` that would import under a ``protected`` top-level name
    (a standard-library module, the runner's or an installed distribution's): a module or
    a package of that name in a folder that a run can put on the module path, that is any
    folder that is not itself a package (no ``__init__.py``)."""
    files = set(files)
    packages = {posixpath.dirname(f) for f in files if posixpath.basename(f) == "__init__.py"}
    found = set()
    for path in files:
        parts = path.split("/")
        for depth, name in enumerate(parts):
            if "/".join(parts[:depth]) in packages:
                continue
            last = depth == len(parts) - 1
            if last and not name.endswith(_MODULE_SUFFIXES):
                continue
            if (name.split(".", 1)[0] if last else name) in protected:
                found.add(path)
                break
    return found
