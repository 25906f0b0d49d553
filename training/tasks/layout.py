"""Which files of a repository are source, which are tests, where imports resolve."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from training.tasks.scrub import LEAKY_DIRS, LEAKY_SUFFIXES

TEST_FILE = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*\.py$|_test\.py$|(^|/)conftest\.py$")
PYTEST_CONFIG = (
    "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
    "pyproject.toml",
)  # fmt: skip
#: Files Python or pytest runs or reads on their own when found: a conftest, the
#: interpreter's startup hooks on the module path, pytest's configuration.
STARTUP_FILES = ("conftest.py", "sitecustomize.py", "usercustomize.py", *PYTEST_CONFIG)
_NOT_SOURCE = re.compile(r"(^|/)(docs?|examples?|benchmarks?|scripts)/|(^|/)(setup|noxfile)\.py$")


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
