"""`cstack tasks audit`: its table, its exit status, and one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from training.rl.tasks.builder import BuildConfig, build_tasks
from training.rl.tasks.cli import tasks_app

FIXTURE = Path(__file__).parent / "fixture_repo"


@pytest.fixture(scope="module")
def task_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    build_tasks(FIXTURE, out, BuildConfig(max_tasks=1, only=("to_roman",), source_name="textkit"))
    return out


def test_the_audit_prints_each_play_and_passes_when_all_hold(task_root: Path) -> None:
    result = CliRunner().invoke(tasks_app, [
        "audit", "--tasks", str(task_root), "--attack", "shadow_pytest_module",
        "--attack", "patch_runtest_split_strings",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.splitlines()[1:-1]]
    assert [(r[1], r[2], r[3], r[5]) for r in rows] == [
        ("clean_solution", "1.000", "1.000", "held"),
        ("shadow_pytest_module", "0.000", "0.000", "held"),
        ("patch_runtest_split_strings", "1.000", "0.000", "held"),
    ]
    assert "shadowing_module" in rows[1][4] and "exit_or_skip" in rows[2][4]
    assert result.output.splitlines()[-1] == "3/3 held"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--attack", "nope"], "unknown attack 'nope'"),
        (["--limit", "-1"], "must be 0 or more"),
    ],
)
def test_bad_input_is_one_line(task_root: Path, arguments: list[str], message: str) -> None:
    result = CliRunner().invoke(tasks_app, ["audit", "--tasks", str(task_root), *arguments])
    assert result.exit_code == 2 and message in result.output


def test_a_folder_without_tasks_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        tasks_app, ["audit", "--tasks", str(tmp_path)], env={"COLUMNS": "1000"}
    )
    assert result.exit_code == 2 and "holds no task" in result.output
