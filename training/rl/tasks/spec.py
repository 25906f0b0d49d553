"""What a built task is: the deleted feature, the tests that judge it, the leak canaries."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

FeatureKind = Literal["function", "method", "class", "file"]


class Feature(BaseModel):
    """The deleted feature: ``path`` is relative to the repo, ``name`` is qualified."""

    kind: FeatureKind
    path: str
    name: str


class TaskSpec(BaseModel):
    """Saved as ``task.json`` next to ``repo/`` (the sandbox template the agent gets).

    ``test_files`` are the repo's test and pytest-config files, which the reward run
    resets from ``harness/original/`` so an episode cannot change its own judge.
    """

    task_id: str
    source: str
    feature: Feature
    #: Features deleted besides ``feature``: a harder variant of a task, built by deleting
    #: another kept task's feature too (more to rebuild, more tests to bring back).
    also_removed: list[Feature] = []
    #: The task this one is the harder variant of, and this task's own harder variant
    #: (the curriculum adds it to the draw once this one is solved).
    variant_of: str | None = None
    harder: str | None = None
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    test_files: list[str]
    canaries: list[str]
    python_paths: list[str]
    #: Installed distributions the codebase declares (``training.rl.tasks.dependencies``):
    #: the only site-packages its test runs see, besides pytest's own.
    dependencies: list[str] = []
