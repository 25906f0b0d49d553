"""Run a repository's pytest suite in the sandbox and decide one outcome per test id.

Task builds and rewards both come from here, and the suite imports the episode's code,
which can do anything inside the test process. So the run happens in
``training.rl.agent.isolation``'s sandbox, and nothing the test process writes is trusted:
no results file, no exit status on its own. Outcomes come from the reporter
(``training.rl.tasks.pytest_plugin``), which the bootstrap (``training.rl.agent.pytest_bootstrap``)
imports from outside the tree, with pytest and its plugins, before any path of the
repository is on the module path, and which streams one keyed record per test phase out
of the sandbox as it happens. No file in the tree can stand in for any of them.

A test passes only when its records are exactly setup, call and teardown, each passed
and none an expected failure; a duplicate or missing phase fails it. The run counts at
all only when every record carries the run's key, the last one reports the session's
end, and its exit status is the process's: a run that was killed, timed out, or left
through ``os._exit`` passes nothing, whatever it wrote before.

What this cannot stop: code imported by the tests runs in the reporter's own process, so
it can subvert pytest itself (replace ``Function.runtest``, call the reporter with forged
records, make ``__eq__`` always true). No channel out of that process can tell; the
reward-hack monitor's rules flag such code (``training.rl.monitor``) and a flagged episode
earns nothing.

The run never writes into the repo: no bytecode, no ``.pytest_cache`` (cacheprovider
off). Plugin auto-loading is off so the runner's own environment cannot change the
verdict.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.rl.agent.isolation import SANDBOX_ROOT, Completed, RunLimits, run_isolated
from training.rl.agent.pytest_run import pytest_run

#: The module name the reporter is loaded under.
_REPORTER = "cstack_report"
_PHASES = ["setup", "call", "teardown"]


@dataclass
class SuiteResult:
    """Outcome per node id; ``rejected`` says why a run's records were not trusted."""

    outcomes: dict[str, bool] = field(default_factory=dict)
    collect_errors: list[str] = field(default_factory=list)
    timed_out: bool = False
    returncode: int = 0
    rejected: str = ""

    @property
    def passed(self) -> set[str]:
        return {test for test, ok in self.outcomes.items() if ok}


def _records(report: bytes, key: str) -> list[dict[str, Any]] | str:
    """The run's records, or why they cannot be trusted."""
    lines = report.split(b"\n")
    if lines.pop() != b"":
        return "the report ends mid-record"
    records: list[dict[str, Any]] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            return "a report line is not JSON"
        if not isinstance(record, dict) or record.get("key") != key:
            return "a record without the run's key"
        records.append(record)
    return records


def read_report(done: Completed, key: str) -> SuiteResult:
    """Outcomes from a finished run's records, under the rules in the module docstring."""
    result = SuiteResult(timed_out=done.timed_out, returncode=done.returncode)
    records = _records(done.report, key)
    if isinstance(records, str):
        result.rejected = records
        return result
    finish = [r for r in records if "finish" in r]
    if done.timed_out:
        result.rejected = "the run timed out"
    elif len(finish) != 1 or records[-1] is not finish[0]:
        result.rejected = "the session did not end (killed, or left early)"
    elif finish[0]["finish"] != done.returncode:
        result.rejected = f"exit status {done.returncode}, reported {finish[0]['finish']}"
    if result.rejected:
        return result
    phases: dict[str, list[tuple[Any, Any, Any]]] = {}
    for record in records:
        if "test" in record:
            phase = (record.get("when"), record.get("outcome"), record.get("xfail"))
            phases.setdefault(str(record["test"]), []).append(phase)
        elif "collect_error" in record:
            result.collect_errors.append(str(record["collect_error"]))
    clean = [(when, "passed", False) for when in _PHASES]
    result.outcomes = {test: seen == clean for test, seen in phases.items()}
    return result


def run_suite(
    repo: Path,
    python_paths: Sequence[str] = (".",),
    node_ids: Sequence[str] = (),
    timeout_s: float = 300.0,
    dependencies: Sequence[str] = (),
) -> SuiteResult:
    """Run pytest on ``repo`` (or only ``node_ids``) in the sandbox, with ``dependencies``
    (distribution names) importable; outcomes per node id."""
    key = secrets.token_hex(16)
    args = [
        "-q", "-p", _REPORTER, "-p", "no:cacheprovider", "--rootdir", SANDBOX_ROOT,
        "-o", "console_output_style=classic", *node_ids,
    ]  # fmt: skip
    run = pytest_run(
        args, python_paths, dependencies, {_REPORTER: Path(__file__).with_name("pytest_plugin.py")}
    )
    limits = RunLimits(wall_time_s=timeout_s, cpu_time_s=math.ceil(timeout_s))
    done = run_isolated(
        run.argv, repo, limits, run.env, mounts=run.mounts, report_key=key, runtime=run.runtime
    )
    return read_report(done, key)
