"""Run a repository's pytest suite in a subprocess and return one outcome per test id.

The run never writes into the repo: no bytecode (PYTHONDONTWRITEBYTECODE), no
``.pytest_cache`` (cacheprovider off), results written outside. Plugin auto-loading is
off so the runner's own environment (pytest-asyncio, ...) cannot change the verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SuiteResult:
    """Outcome per node id; ``timed_out`` runs report what finished before the kill."""

    outcomes: dict[str, bool] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    timed_out: bool = False
    returncode: int = 0

    @property
    def passed(self) -> set[str]:
        return {test for test, ok in self.outcomes.items() if ok}


def suite_env(repo: Path, python_paths: Sequence[str]) -> dict[str, str]:
    """A minimal environment: the repo's source roots first on the path, nothing else."""
    paths = [str(repo / p) for p in python_paths]
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(repo),
        "PYTHONPATH": os.pathsep.join(paths),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "LC_ALL": "C.UTF-8",
    }


def run_suite(
    repo: Path,
    python_paths: Sequence[str] = (".",),
    node_ids: Sequence[str] = (),
    timeout_s: float = 300.0,
) -> SuiteResult:
    """Run pytest on ``repo`` (or only ``node_ids``) and collect outcomes."""
    with tempfile.TemporaryDirectory(prefix="cstack-suite-") as scratch:
        results = Path(scratch) / "results.json"
        command = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-p", "training.tasks.pytest_plugin", f"--cstack-results={results}",
            "--rootdir", str(repo), "-o", "console_output_style=classic",
            *node_ids,
        ]  # fmt: skip
        try:
            proc = subprocess.run(
                command, cwd=repo, env=suite_env(repo, python_paths), capture_output=True,
                timeout=timeout_s, check=False,
            )  # fmt: skip
            returncode, timed_out = proc.returncode, False
        except subprocess.TimeoutExpired:
            returncode, timed_out = -9, True
        if not results.exists():
            return SuiteResult(timed_out=timed_out, returncode=returncode)
        payload = json.loads(results.read_text())
        return SuiteResult(
            outcomes={k: bool(v) for k, v in payload["outcomes"].items()},
            collect_errors=list(payload["collect_errors"]),
            timed_out=timed_out,
            returncode=returncode,
        )
