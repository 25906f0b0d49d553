"""Feature-deletion coding tasks: build, scrub, prove no leak, score.

Exports load lazily (PEP 562) so `cstack --help` does not import the builder's deps.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BuildConfig": "training.tasks.builder",
    "BuildReport": "training.tasks.builder",
    "TaskBuildError": "training.tasks.builder",
    "build_tasks": "training.tasks.builder",
    "load_task": "training.tasks.builder",
    "canaries": "training.tasks.deletion",
    "candidates": "training.tasks.deletion",
    "delete_feature": "training.tasks.deletion",
    "discover": "training.tasks.layout",
    "is_test_file": "training.tasks.layout",
    "FetchError": "training.tasks.pypi",
    "fetch_sdist": "training.tasks.pypi",
    "evaluate_sandbox": "training.tasks.reward",
    "task_reward": "training.tasks.reward",
    "CanaryHit": "training.tasks.scrub",
    "canary_scan": "training.tasks.scrub",
    "installed_copy": "training.tasks.scrub",
    "scrub": "training.tasks.scrub",
    "Feature": "training.tasks.spec",
    "TaskSpec": "training.tasks.spec",
    "SuiteResult": "training.tasks.suite",
    "run_suite": "training.tasks.suite",
}

__all__ = [
    "BuildConfig",
    "BuildReport",
    "CanaryHit",
    "Feature",
    "FetchError",
    "SuiteResult",
    "TaskBuildError",
    "TaskSpec",
    "build_tasks",
    "canaries",
    "canary_scan",
    "candidates",
    "delete_feature",
    "discover",
    "evaluate_sandbox",
    "fetch_sdist",
    "installed_copy",
    "is_test_file",
    "load_task",
    "run_suite",
    "scrub",
    "task_reward",
]

if TYPE_CHECKING:
    from training.tasks.builder import (
        BuildConfig,
        BuildReport,
        TaskBuildError,
        build_tasks,
        load_task,
    )
    from training.tasks.deletion import canaries, candidates, delete_feature
    from training.tasks.layout import discover, is_test_file
    from training.tasks.pypi import FetchError, fetch_sdist
    from training.tasks.reward import evaluate_sandbox, task_reward
    from training.tasks.scrub import CanaryHit, canary_scan, installed_copy, scrub
    from training.tasks.spec import Feature, TaskSpec
    from training.tasks.suite import SuiteResult, run_suite


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'training.tasks' has no attribute {name!r}")
    return getattr(import_module(module), name)
