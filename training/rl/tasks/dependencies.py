"""The distributions a codebase declares it needs, as installed where tasks are built.

A test run's sandbox shows pytest and these, nothing else of site-packages
(``training.rl.agent.runtime``), so a codebase's suite still imports what it declares while
an unrelated installed package (perhaps another copy of the codebase) stays out of reach.
Read from the places codebases declare them: ``pyproject.toml`` (dependencies and the
test extras), ``setup.cfg``, ``setup.py`` (literal lists only; it is never run) and
requirements files for tests. Only distributions installed here are kept (the others
would fail the baseline run, which says so), never the codebase's own.
"""

from __future__ import annotations

import ast
import configparser
import re
import tomllib
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from training.rl.agent.runtime import RUNNER_DISTRIBUTIONS, canonical

#: Extras and requirement files that hold what a codebase's tests need.
_TEST_EXTRA = re.compile(r"^(test|tests|testing|dev)$", re.IGNORECASE)
_REQUIREMENT_FILES = (
    "requirements.txt", "requirements-test.txt", "requirements_test.txt",
    "test-requirements.txt", "test_requirements.txt", "requirements-dev.txt",
    "requirements/test.txt", "requirements/tests.txt", "requirements/testing.txt",
    "tests/requirements.txt",
)  # fmt: skip


def _pyproject(repo: Path) -> tuple[str, list[str]]:
    path = repo / "pyproject.toml"
    if not path.is_file():
        return "", []
    try:
        project = tomllib.loads(path.read_text(errors="replace")).get("project", {})
    except tomllib.TOMLDecodeError:
        return "", []
    found = list(project.get("dependencies", []))
    for extra, items in project.get("optional-dependencies", {}).items():
        if _TEST_EXTRA.match(extra):
            found += items
    return str(project.get("name", "")), found


def _setup_cfg(repo: Path) -> tuple[str, list[str]]:
    path = repo / "setup.cfg"
    if not path.is_file():
        return "", []
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(path.read_text(errors="replace"))
    except configparser.Error:
        return "", []
    found = parser.get("options", "install_requires", fallback="").splitlines()
    found += parser.get("options", "tests_require", fallback="").splitlines()
    if parser.has_section("options.extras_require"):
        for extra, items in parser.items("options.extras_require"):
            if _TEST_EXTRA.match(extra):
                found += items.splitlines()
    return parser.get("metadata", "name", fallback=""), found


def _literal_strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    if isinstance(node, ast.Dict):
        return [s for key, value in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant) and _TEST_EXTRA.match(str(key.value))
                for s in _literal_strings(value)]  # fmt: skip
    return []


def _setup_py(repo: Path) -> tuple[str, list[str]]:
    path = repo / "setup.py"
    if not path.is_file():
        return "", []
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return "", []
    lists: dict[str, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                lists[target.id] = node.value
    name, found = "", []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            value: ast.AST = keyword.value
            if isinstance(value, ast.Name):
                value = lists.get(value.id, value)
            if keyword.arg == "name" and isinstance(value, ast.Constant):
                name = str(value.value)
            elif keyword.arg in ("install_requires", "tests_require", "extras_require"):
                found += _literal_strings(value)
    return name, found


def _requirement_files(repo: Path) -> Iterator[str]:
    for relative in _REQUIREMENT_FILES:
        path = repo / relative
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                line = line.split("#", 1)[0].strip()
                if line and not line.startswith("-"):
                    yield line


def _installed(raw: Iterable[str]) -> Iterator[str]:
    for text in raw:
        try:
            requirement = Requirement(text.strip())
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue
        yield canonical(requirement.name)


def declared_dependencies(repo: Path, own_modules: Iterable[str] = ()) -> list[str]:
    """Installed distributions ``repo`` declares (canonical names, sorted), without the
    runner's own, the codebase itself, or any that provides one of ``own_modules``."""
    names, raw = set(), []
    for reader in (_pyproject, _setup_cfg, _setup_py):
        name, found = reader(repo)
        if name:
            names.add(canonical(name))
        raw += found
    raw += _requirement_files(repo)
    own = set(own_modules)
    kept = set()
    for dist in set(_installed(raw)) - names - {canonical(n) for n in RUNNER_DISTRIBUTIONS}:
        provides = {Path(str(f)).parts[0].split(".")[0] for f in metadata.files(dist) or ()}
        if not provides & own:
            kept.add(dist)
    return sorted(kept)
