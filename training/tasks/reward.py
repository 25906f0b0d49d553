"""The task reward: a harness-owned test run with the test files reset to the originals.

The episode's sandbox is copied, every test and pytest-config file is restored from
``harness/original/`` (test files the episode added are removed), and only the task's
FAIL_TO_PASS and PASS_TO_PASS tests run. Nothing the episode did to its tests counts.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from training.tasks.builder import load_task
from training.tasks.layout import is_test_file
from training.tasks.scrub import scrub
from training.trajectory import TestOutcome


def evaluate_sandbox(task_dir: Path, sandbox: Path, timeout_s: float = 300.0) -> TestOutcome:
    from training.tasks.suite import run_suite

    task = load_task(task_dir)
    originals = Path(task_dir) / "harness" / "original"
    with tempfile.TemporaryDirectory(prefix="cstack-score-") as scratch:
        scoring = Path(scratch) / "repo"
        shutil.copytree(sandbox, scoring, symlinks=False, ignore_dangling_symlinks=True)
        scrub(scoring)
        for path in sorted(scoring.rglob("*")):
            relative = path.relative_to(scoring).as_posix()
            if path.is_file() and is_test_file(relative) and relative not in task.test_files:
                path.unlink()
        for relative in task.test_files:
            (scoring / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(originals / relative, scoring / relative)
        result = run_suite(
            scoring, task.python_paths, task.fail_to_pass + task.pass_to_pass, timeout_s
        )
    return TestOutcome(
        fail_to_pass={t: result.outcomes.get(t, False) for t in task.fail_to_pass},
        pass_to_pass={t: result.outcomes.get(t, False) for t in task.pass_to_pass},
    )


def task_reward(outcome: TestOutcome) -> float:
    """Share of FAIL_TO_PASS tests fixed, and zero if any PASS_TO_PASS test broke."""
    if not all(outcome.pass_to_pass.values()) or not outcome.fail_to_pass:
        return 0.0
    return sum(outcome.fail_to_pass.values()) / len(outcome.fail_to_pass)
