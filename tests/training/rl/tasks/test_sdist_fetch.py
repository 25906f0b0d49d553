"""Fetching a codebase's sdist with pip, and the local cache that spares later builds the
index. pip reads a folder of archives here instead of PyPI (``PIP_NO_INDEX``,
``PIP_FIND_LINKS``), so the fetch is real pip and needs no network."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from training.rl.tasks.pypi import FetchError, fetch_sdist

PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "cachedpkg"
version = "0.1"
"""


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder pip takes as its only index, holding ``cachedpkg-0.1.tar.gz``."""
    source = tmp_path / "source" / "cachedpkg-0.1"
    (source / "cachedpkg").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "cachedpkg" / "__init__.py").write_text("def answer():\n    return 42\n")
    (source / "tests").mkdir()
    (source / "tests" / "test_answer.py").write_text(
        "from cachedpkg import answer\n\ndef test_answer():\n    assert answer() == 42\n"
    )
    links = tmp_path / "links"
    links.mkdir()
    with tarfile.open(links / "cachedpkg-0.1.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="cachedpkg-0.1")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    # Reading an sdist's metadata builds it: with the venv's setuptools, not a download.
    # (pip reads this variable inverted: "0" means no build isolation.)
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")
    return links


def test_a_pinned_sdist_is_fetched_once_then_unpacked_from_the_cache(
    index: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = fetch_sdist("cachedpkg==0.1", tmp_path / "first", cache)
    assert (first / "tests" / "test_answer.py").is_file()
    assert [p.name for p in (cache / "cachedpkg==0.1").iterdir()] == ["cachedpkg-0.1.tar.gz"]

    (index / "cachedpkg-0.1.tar.gz").unlink()  # pip could no longer find it
    second = fetch_sdist("cachedpkg==0.1", tmp_path / "second", cache)
    assert (second / "cachedpkg" / "__init__.py").read_text() == (
        first / "cachedpkg" / "__init__.py"
    ).read_text()
    # Without the cache, the same fetch goes to pip, which now has nothing to give.
    with pytest.raises(FetchError, match=re.escape("pip download 'cachedpkg==0.1' failed")):
        fetch_sdist("cachedpkg==0.1", tmp_path / "third")


def test_an_unpinned_requirement_is_fetched_but_never_cached(index: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    root = fetch_sdist("cachedpkg", tmp_path / "fetched", cache)
    assert (root / "pyproject.toml").is_file()
    assert not cache.exists()  # tomorrow "cachedpkg" may be another release


def test_a_damaged_cached_archive_is_a_fetch_error_naming_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "cachedpkg==0.1").mkdir(parents=True)
    (cache / "cachedpkg==0.1" / "cachedpkg-0.1.tar.gz").write_bytes(b"not a tar archive")
    with pytest.raises(FetchError, match=re.escape("cachedpkg-0.1.tar.gz cannot be unpacked")):
        fetch_sdist("cachedpkg==0.1", tmp_path / "fetched", cache)
