"""A task's scoring run: the harness-owned test run over a clean snapshot of the episode's
repo (its outcome becomes a reward in ``training.rl.rewards``).

Nothing the episode left behind is trusted. Its sandbox is copied without following a
link or opening a special file, and refused whole when over the size cap (no reward).
In the copy, leak sources are scrubbed, then every test file and every file that changes
a run by merely existing (conftest.py, sitecustomize.py, usercustomize.py, pytest
configuration) is restored from ``harness/original/`` when the task lists it, kept when
it is byte for byte the task's own, and deleted otherwise; so is every module that would
shadow the standard library, the runner or an installed distribution (``pytest.py``,
``_pytest/``, ``json.py`` in a folder a run can put on the module path). Only the task's
FAIL_TO_PASS and PASS_TO_PASS tests run, in the sandbox, and their outcomes come from the
reporter's stream out of it (``training.rl.tasks.suite``), never from a file. Nothing the
episode did to its tests or the test run's setup counts.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from training.rl.agent.runtime import pytest_runtime
from training.rl.agent.trees import TreeCaps, TreeTooLarge, copy_tree, read_regular, walk
from training.rl.tasks.builder import load_task
from training.rl.tasks.layout import HARNESS_MODULES, is_test_file, runs_at_startup, shadowing_paths
from training.rl.tasks.scrub import scrub
from training.rl.tasks.spec import TaskSpec
from training.rl.trajectory import TestOutcome


def protected_modules(task: TaskSpec) -> frozenset[str]:
    """Top-level names no file of the task's tree may provide in a test run."""
    runtime = pytest_runtime(task.dependencies)
    return frozenset(sys.stdlib_module_names) | runtime.modules | HARNESS_MODULES


def _reset(scoring: Path, task: TaskSpec, task_dir: Path, caps: TreeCaps) -> None:
    template, originals = task_dir / "repo", task_dir / "harness" / "original"
    scrub(scoring)
    files = {relative: size for relative, size in walk(scoring, caps) if size is not None}
    shadowing = shadowing_paths(files, protected_modules(task))
    for relative, size in files.items():
        if relative in task.test_files:
            continue
        if is_test_file(relative) or runs_at_startup(relative) or relative in shadowing:
            ours = read_regular(template / relative, size + 1)
            if ours is None or read_regular(scoring / relative, size) != ours:
                (scoring / relative).unlink()
    for relative in task.test_files:
        target = scoring / relative
        if target.is_dir():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((originals / relative).read_bytes())


def _outcome(task: TaskSpec, outcomes: dict[str, bool]) -> TestOutcome:
    return TestOutcome(
        fail_to_pass={t: outcomes.get(t, False) for t in task.fail_to_pass},
        pass_to_pass={t: outcomes.get(t, False) for t in task.pass_to_pass},
    )


def evaluate_sandbox(
    task_dir: Path, sandbox: Path, timeout_s: float = 300.0, caps: TreeCaps | None = None
) -> TestOutcome:
    from training.rl.tasks.suite import run_suite

    task = load_task(task_dir)
    caps = caps or TreeCaps()
    with tempfile.TemporaryDirectory(prefix="cstack-score-") as scratch:
        scoring = Path(scratch) / "repo"
        try:
            copy_tree(sandbox, scoring, caps)
        except TreeTooLarge:
            return _outcome(task, {})
        _reset(scoring, task, Path(task_dir), caps)
        node_ids = task.fail_to_pass + task.pass_to_pass
        result = run_suite(scoring, task.python_paths, node_ids, timeout_s, task.dependencies)
    return _outcome(task, result.outcomes)
