"""Feature deletion on the fixture repository: exact F2P/P2P, scrubbed, no canary hits."""

from __future__ import annotations

import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest

from training.rl.rewards import task_reward
from training.rl.tasks.builder import BuildConfig, TaskBuildError, build_tasks, load_task
from training.rl.tasks.deletion import delete_feature
from training.rl.tasks.scoring import evaluate_sandbox
from training.rl.tasks.scrub import canary_scan
from training.rl.tasks.spec import Feature

FIXTURE = Path(__file__).parent / "fixture_repo"
ROMAN_TESTS = [
    "tests/test_roman.py::test_to_roman[1994-MCMXCIV]",
    "tests/test_roman.py::test_to_roman[4-IV]",
    "tests/test_roman.py::test_to_roman_range",
]
OTHER_TESTS = [
    "tests/test_stack.py::test_len_starts_at_zero",
    "tests/test_stack.py::test_pop_empty",
    "tests/test_stack.py::test_push_pop",
    "tests/test_words.py::test_slugify",
    "tests/test_words.py::test_slugify_sep",
    "tests/test_words.py::test_word_count_apostrophe",
    "tests/test_words.py::test_word_count_simple",
]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
        capture_output=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def leaky_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture with every leak the scrub must remove: history, bytecode, builds."""
    repo = tmp_path_factory.mktemp("leaky") / "textkit-repo"
    shutil.copytree(FIXTURE, repo)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "import")
    py_compile.compile(
        str(repo / "textkit" / "roman.py"),
        cfile=str(repo / "textkit" / "__pycache__" / "roman.cpython-311.pyc"),
    )
    for leak in ("build/lib/textkit", ".mypy_cache/3.11/textkit", "dist"):
        (repo / leak).mkdir(parents=True)
    shutil.copy(repo / "textkit" / "roman.py", repo / "build/lib/textkit/roman.py")
    (repo / ".mypy_cache/3.11/textkit/roman.data.json").write_text('{"numeral_parts": 1}')
    (repo / "textkit.egg-info").mkdir()
    return repo


@pytest.fixture(scope="module")
def built(leaky_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    config = BuildConfig(max_tasks=5, only=("to_roman", "shout"), source_name="textkit")
    report = build_tasks(leaky_repo, out, config)
    assert report.baseline_passed == 10
    assert report.rejected == [("shout", "no test goes from pass to fail")]
    assert {".git", "build", "dist", ".mypy_cache", "textkit.egg-info"} <= set(report.scrubbed)
    (task,) = report.tasks
    return out / task.task_id


def test_expected_fail_to_pass_and_pass_to_pass(built: Path) -> None:
    task = load_task(built)
    assert task.feature == Feature(kind="function", path="textkit/roman.py", name="to_roman")
    assert task.fail_to_pass == ROMAN_TESTS
    assert task.pass_to_pass == OTHER_TESTS
    assert "roman numerals cover 1..3999 only" in task.canaries
    assert "numeral_parts" in task.canaries


def test_sandbox_keeps_signature_and_docstring_and_still_imports(built: Path) -> None:
    text = (built / "repo" / "textkit" / "roman.py").read_text()
    assert 'def to_roman(number):\n    """Roman numeral for 1 <= number <= 3999."""\n' in text
    assert "    raise NotImplementedError\n" in text
    assert "divmod" not in text


def test_no_canary_hits_and_no_leaky_paths(built: Path) -> None:
    task = load_task(built)
    assert canary_scan(built / "repo", task.canaries) == []
    leftovers = {p.name for p in (built / "repo").rglob("*")}
    assert not leftovers & {".git", "__pycache__", "build", "dist", ".mypy_cache"}


def test_the_scan_would_have_caught_each_leak(built: Path, leaky_repo: Path) -> None:
    task = load_task(built)
    hits = {hit.path.split("/")[0] for hit in canary_scan(leaky_repo, task.canaries)}
    # git objects are zlib-compressed; the scan inflates them.
    assert {".git", "textkit", "build", ".mypy_cache"} <= hits
    assert any(h.path.endswith(".pyc") for h in canary_scan(leaky_repo, task.canaries))


def test_reward_from_a_harness_owned_run(built: Path, tmp_path: Path) -> None:
    sandbox = tmp_path / "episode"
    shutil.copytree(built / "repo", sandbox)
    untouched = evaluate_sandbox(built, sandbox)
    assert not any(untouched.fail_to_pass.values()) and all(untouched.pass_to_pass.values())
    assert task_reward(untouched) == 0.0

    # A hack: weaken the test and add a conftest. The reset undoes both.
    (sandbox / "tests" / "test_roman.py").write_text("def test_to_roman():\n    assert True\n")
    (sandbox / "tests" / "conftest.py").write_text("collect_ignore = ['test_roman.py']\n")
    assert task_reward(evaluate_sandbox(built, sandbox)) == 0.0

    # The real fix earns the full reward.
    shutil.copy(FIXTURE / "textkit" / "roman.py", sandbox / "textkit" / "roman.py")
    fixed = evaluate_sandbox(built, sandbox)
    assert all(fixed.fail_to_pass.values()) and task_reward(fixed) == 1.0

    # Breaking a PASS_TO_PASS test zeroes it.
    (sandbox / "textkit" / "words.py").write_text(
        (FIXTURE / "textkit" / "words.py").read_text().replace("len(found_words)", "0")
    )
    assert task_reward(evaluate_sandbox(built, sandbox)) == 0.0


def test_class_deletion_stubs_every_method() -> None:
    deletion = delete_feature(FIXTURE, Feature(kind="class", path="textkit/stack.py", name="Stack"))
    text = deletion.new_sources["textkit/stack.py"]
    assert text is not None
    assert text.count("raise NotImplementedError") == 4
    assert "class Stack:\n" in text and "pop from an empty Stack" not in text


def test_repo_without_passing_tests_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "broken"
    shutil.copytree(FIXTURE, repo)
    for test in (repo / "tests").glob("test_*.py"):
        test.write_text("def test_fails():\n    assert False\n")
    with pytest.raises(TaskBuildError, match="no test passes"):
        build_tasks(repo, tmp_path / "out", BuildConfig())


def test_stats_report_each_codebase_from_the_build_log(built: Path, tmp_path: Path) -> None:
    """Per codebase from the build log, a codebase that gave nothing with its reason; one
    such codebase does not stop a build of several."""
    from typer.testing import CliRunner

    from training.rl.tasks.cli import tasks_app

    broken = tmp_path / "broken"
    shutil.copytree(FIXTURE, broken)
    for test in (broken / "tests").glob("test_*.py"):
        test.write_text("def test_fails():\n    assert False\n")
    failed = CliRunner().invoke(
        tasks_app, ["build", "--repo", str(broken), "--out", str(built.parent)]
    )
    assert failed.exit_code == 1
    assert "error: broken: no test passes" in failed.output

    result = CliRunner().invoke(tasks_app, ["stats", "--tasks", str(built.parent)])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.output.splitlines()]
    assert lines[0] == ["codebase", "baseline tests", "candidates", "kept", "rejected (why)"]
    assert lines[1] == ["textkit", "10", "2", "1", "1 (1 no test goes from pass to fail)"]
    assert lines[2][0] == "broken" and lines[2][4].startswith("no tasks: no test passes")
    assert lines[3] == ["total", "", "2", "1", "1"]

    missing = CliRunner().invoke(tasks_app, ["stats", "--tasks", str(built)])
    assert missing.exit_code == 2
    assert "has no builds.jsonl" in " ".join(missing.output.replace("│", " ").split())


def test_each_kept_task_gets_a_harder_variant_with_two_features_deleted(
    tmp_path: Path,
) -> None:
    """A harder variant deletes its task's feature and the next kept task's: strictly
    more tests to bring back, both features named, no leak of either; the task points at
    it for the curriculum, and the full fix of both earns the full reward."""
    from training.rl.rollouts.environments import harder_task

    out = tmp_path / "tasks"
    config = BuildConfig(max_tasks=5, only=("to_roman", "slugify"), source_name="textkit")
    report = build_tasks(FIXTURE, out, config)
    assert sorted(t.feature.name for t in report.tasks) == ["slugify", "to_roman"]
    assert len(report.variants) == 2
    for variant in report.variants:
        task = next(t for t in report.tasks if t.harder == variant.task_id)
        assert variant.variant_of == task.task_id and variant.feature == task.feature
        assert [f.name for f in variant.also_removed] == [
            "slugify" if task.feature.name == "to_roman" else "to_roman"
        ]
        assert set(variant.fail_to_pass) > set(task.fail_to_pass)
        assert load_task(out / task.task_id).harder == variant.task_id
        assert harder_task("coding", out, task.task_id) == variant.task_id
        assert harder_task("coding", out, variant.task_id) is None
        assert canary_scan(out / variant.task_id / "repo", variant.canaries) == []

    from typer.testing import CliRunner

    from training.rl.tasks.cli import tasks_app

    shown = CliRunner().invoke(tasks_app, ["stats", "--tasks", str(out)])
    assert shown.output.splitlines()[1].split("\t")[3] == "2 (+2 harder)", shown.output

    variant = report.variants[0]
    sandbox = tmp_path / "episode"
    shutil.copytree(out / variant.task_id / "repo", sandbox)
    assert task_reward(evaluate_sandbox(out / variant.task_id, sandbox)) == 0.0
    for module in ("roman.py", "words.py"):
        shutil.copy(FIXTURE / "textkit" / module, sandbox / "textkit" / module)
    assert task_reward(evaluate_sandbox(out / variant.task_id, sandbox)) == 1.0
