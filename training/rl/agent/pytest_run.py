"""One pytest run in the sandbox: its command, environment, mounts and Python view.

Both kinds of run an episode has go through here, so both see the same Python: the
model's own ``run_tests`` calls and the reward's scoring run. Each starts pytest through
``training.rl.agent.pytest_bootstrap``, which imports the runner (and the scoring run's
reporter) before the repository's source roots are on the module path, and sees only the
standard library, pytest and the task's declared dependencies (``training.rl.agent.runtime``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from training.rl.agent.isolation import SANDBOX_ROOT, Mount
from training.rl.agent.runtime import SITE_DIR, PythonRuntime, pytest_runtime

#: Where the bootstrap and any plugin files are mounted inside the sandbox.
RUNNER_DIR = "/run/cstack"
_BOOTSTRAP = Path(__file__).with_name("pytest_bootstrap.py")


@dataclass(frozen=True)
class PytestRun:
    """What ``run_isolated`` needs to run pytest once (see the module docstring)."""

    argv: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    runtime: PythonRuntime


def pytest_run(
    args: Sequence[str],
    python_paths: Sequence[str] = (".",),
    dependencies: Sequence[str] = (),
    plugins: Mapping[str, Path] | None = None,
) -> PytestRun:
    """pytest with ``args`` over the tree at /repo, its ``python_paths`` (relative to the
    tree) importable after the runner, ``dependencies`` (distribution names) installed,
    and each of ``plugins`` (module name -> file) loaded before anything else."""
    runtime = pytest_runtime(dependencies)
    roots = [posixpath.normpath(posixpath.join(SANDBOX_ROOT, p)) for p in python_paths]
    mounts = [Mount(_BOOTSTRAP, f"{RUNNER_DIR}/{_BOOTSTRAP.name}")]
    options: list[str] = []
    for name, source in (plugins or {}).items():
        mounts.append(Mount(source, f"{RUNNER_DIR}/{name}.py"))
        options += ["--plugin", f"{name}={RUNNER_DIR}/{name}.py"]
    argv = [
        # -B: no bytecode written into the tree; -P -s -S: nothing on the module path but
        # the standard library until the bootstrap adds the runner, then the repository.
        runtime.interpreter, "-B", "-P", "-s", "-S", f"{RUNNER_DIR}/{_BOOTSTRAP.name}",
        SITE_DIR, ":".join(roots), *options, "--", "--import-mode=append", *args,
    ]  # fmt: skip
    env = {"PYTHONHASHSEED": "0", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return PytestRun(argv, env, mounts, runtime)
