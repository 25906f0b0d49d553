"""Nothing of a task's answer in reach: the sandbox's view of Python, the leak sweep the
builder runs inside it, declared dependencies, and the reset's removal of shadowing files.

All against the real sandbox (bwrap) on this machine, whose system and interpreter hold
copies of many small codebases.
"""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from training.rl.agent.isolation import RunLimits, run_isolated
from training.rl.agent.runtime import pytest_runtime
from training.rl.tasks.builder import BuildConfig, TaskBuildError, build_tasks
from training.rl.tasks.dependencies import declared_dependencies
from training.rl.tasks.layout import shadowing_paths
from training.rl.tasks.leaks import distinctive_lines, sweep

#: Installed here for the project itself, never declared by the repositories below.
UNDECLARED = "PyYAML"

_PROBE = """
import importlib.util, json, os, sys
sys.path.append("/opt/cstack/site-packages")
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as err:
        return type(err).__name__
print(json.dumps({
    "yaml": importlib.util.find_spec("yaml") is not None,
    "pytest": importlib.util.find_spec("pytest") is not None,
    "venv": listing(sys.argv[1]),
    "stdlib_site": listing(sys.argv[2]),
    "dist_packages": listing("/usr/lib/python3/dist-packages"),
    "usr_lib": listing("/usr/lib"),
    "usr_share": listing("/usr/share"),
}))
"""


def _in_sandbox(tmp_path: Path, code: str, *args: str, declared: tuple[str, ...] = ()) -> dict:
    runtime = pytest_runtime(declared)
    done = run_isolated([runtime.interpreter, "-I", "-S", "-c", code, *args], tmp_path,
                        RunLimits(wall_time_s=60), {}, runtime=runtime)  # fmt: skip
    assert done.returncode == 0, done.output.decode()
    return json.loads(done.output.decode().splitlines()[-1])


def test_the_sandbox_shows_the_runner_and_hides_every_other_package(tmp_path: Path) -> None:
    stdlib_site = Path(inspect.getfile(textwrap)).parent / "site-packages"
    seen = _in_sandbox(tmp_path, _PROBE, sys.prefix, str(stdlib_site))
    assert seen["pytest"] and not seen["yaml"]
    assert seen["venv"] == "FileNotFoundError" or sys.prefix.startswith("/usr")
    assert seen["stdlib_site"] in ([], "FileNotFoundError")
    assert seen["dist_packages"] == "FileNotFoundError"
    assert seen["usr_share"] == "FileNotFoundError"
    assert "python3" not in seen["usr_lib"] and "google-cloud-sdk" not in seen["usr_lib"]


def test_a_declared_dependency_is_shown(tmp_path: Path) -> None:
    seen = _in_sandbox(tmp_path, _PROBE, sys.prefix, "/nowhere", declared=(UNDECLARED,))
    assert seen["yaml"]


def test_the_sweep_finds_copies_the_sandbox_can_read_and_only_those() -> None:
    dedent = inspect.getsource(textwrap.dedent)
    yaml_loader = Path(metadata.distribution(UNDECLARED).locate_file("yaml/loader.py"))
    hidden = yaml_loader.read_text()
    groups = {
        "dedent": distinctive_lines(dedent, ""),
        "yaml_loader": distinctive_lines(hidden, ""),
    }
    assert len(groups["dedent"]) >= 3 and len(groups["yaml_loader"]) >= 3
    found = sweep(groups, modules=["textwrap", "yaml"])
    assert found.files > 1000
    assert any(path.endswith("/textwrap.py") for path in found.copies["dedent"])
    assert "yaml_loader" not in found.copies
    assert set(found.importable) == {"textwrap"}
    # With PyYAML declared, its copy is in reach, and the sweep says so.
    declared = sweep(groups, modules=["yaml"], dependencies=[UNDECLARED])
    assert "yaml_loader" in declared.copies and "yaml" in declared.importable


def _write_repo(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_feature_copied_from_the_standard_library_is_not_kept(tmp_path: Path) -> None:
    """The builder refuses what the sandbox can read, though no import names it."""
    copied = inspect.getsource(textwrap.dedent)
    repo = _write_repo(tmp_path / "repo", {
        "wraptext/__init__.py": "import re\n\n_whitespace_only_re = re.compile("
                                "'^[ \\t]+$', re.MULTILINE)\n_leading_whitespace_re = "
                                "re.compile('(^[ \\t]*)(?:[^ \\t\\n])', re.MULTILINE)\n\n\n"
                                f"{copied}\n\ndef shout(text):\n    return text.upper() + '!'\n",
        "tests/test_wrap.py": "from wraptext import dedent, shout\n\n\ndef test_dedent():\n"
                              "    assert dedent('  a\\n  b') == 'a\\nb'\n\n\ndef test_shout():\n"
                              "    assert shout('hi') == 'HI!'\n",
    })  # fmt: skip
    out = tmp_path / "tasks"
    report = build_tasks(repo, out, BuildConfig(max_tasks=5, harder_variants=False))
    reasons = dict(report.rejected)
    assert "dedent" in reasons and "readable in the sandbox at" in reasons["dedent"]
    assert reasons["dedent"].endswith("/textwrap.py")
    assert [task.feature.name for task in report.tasks] == ["shout"]


def test_a_codebase_importable_in_the_sandbox_is_not_built(tmp_path: Path) -> None:
    repo = _write_repo(tmp_path / "repo", {
        "textwrap.py": "def dedent(text):\n    return text.strip()\n",
        "test_it.py": "from textwrap import dedent\n\n\ndef test_it():\n    assert dedent(' a ')\n",
    })  # fmt: skip
    with pytest.raises(TaskBuildError, match=r"module 'textwrap' is importable in the sandbox"):
        build_tasks(repo, tmp_path / "tasks", BuildConfig())


def test_declared_dependencies_from_each_place_a_codebase_declares_them(tmp_path: Path) -> None:
    repo = _write_repo(tmp_path / "repo", {
        "pyproject.toml": '[project]\nname = "demo"\ndependencies = ["PyYAML>=5"]\n'
                          '[project.optional-dependencies]\ntest = ["hypothesis"]\n'
                          'docs = ["redis"]\n',
        "setup.py": "from setuptools import setup\nREQS = ['pydantic']\n"
                    "setup(name='demo', install_requires=REQS,\n"
                    "      extras_require={'test': ['httpx']})\n",
        "requirements-test.txt": "# tests\nnot-installed-anywhere==1.0\n-r other.txt\nattrs\n",
    })  # fmt: skip
    found = declared_dependencies(repo, own_modules=["demo"])
    assert {"pyyaml", "pydantic", "httpx"} <= set(found)
    assert "redis" not in found  # a docs extra, not the tests'
    assert "not-installed-anywhere" not in found and "demo" not in found
    assert "pytest" not in found


def test_declared_dependencies_drop_one_that_provides_the_codebase_itself(tmp_path: Path) -> None:
    repo = _write_repo(tmp_path / "repo", {"requirements.txt": "PyYAML\n"})
    assert declared_dependencies(repo, own_modules=["yaml"]) == []


def test_shadowing_paths_are_modules_where_a_run_can_put_their_folder_first() -> None:
    files = ["pytest.py", "src/pluggy/__init__.py", "pkg/__init__.py", "pkg/json.py",
             "json/__init__.py", "tests/_pytest.py", "pkg/sub/__init__.py", "notes.txt",
             "x.cpython-311-x86_64-linux-gnu.so", "docs/conf.py"]  # fmt: skip
    protected = set(sys.stdlib_module_names) | {"pytest", "pluggy", "_pytest", "x"}
    assert shadowing_paths(files, protected) == {
        "pytest.py", "src/pluggy/__init__.py", "json/__init__.py", "tests/_pytest.py",
        "x.cpython-311-x86_64-linux-gnu.so",
    }  # fmt: skip
