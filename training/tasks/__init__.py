"""Feature-deletion coding tasks: build, scrub, prove no leak, score."""

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
