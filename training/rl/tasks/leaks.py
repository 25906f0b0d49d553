"""Copies of a task's deleted code anywhere its sandbox can read, found before it is kept.

A task is worthless as a reward if the policy can read the answer: an installed copy of
the codebase, a copy vendored inside another package, the standard library's own version
of a backported module. The sandbox shows little of the machine (``training.rl.agent.runtime``),
but what it shows still varies by machine and by a task's dependencies, so the builder asks
the sandbox itself: ``training.rl.agent.leak_sweep`` runs inside it, with the view a test run
of the task gets, and searches every file it can read (archives included) for each
candidate's distinctive lines, and tries importing the codebase's own modules. A candidate
found anywhere is not kept; a codebase importable from outside its tree is not built.
"""

from __future__ import annotations

import builtins
import json
import keyword
import math
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from training.rl.agent.isolation import Mount, RunLimits, run_isolated
from training.rl.agent.runtime import SITE_DIR, pytest_runtime

_SCRIPT = Path(__file__).resolve().parents[1] / "agent" / "leak_sweep.py"
_DIR = "/run/cstack"
#: Lines shorter than this, or made only of keywords, builtins and punctuation, say nothing
#: of where they came from (``return result``, ``except KeyError:``).
_MIN_CHARS = 16
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_PLAIN = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "cls"}


class SweepFailed(RuntimeError):
    """The sweep did not finish: no task can be trusted without it."""


@dataclass(frozen=True)
class SweepResult:
    #: Candidate name -> where a copy of its lines was found (at most 20 places each).
    copies: dict[str, list[str]] = field(default_factory=dict)
    #: Module name -> where the sandbox's Python imports it from.
    importable: dict[str, str] = field(default_factory=dict)
    #: How many files the sweep read (a sanity check that it looked at all).
    files: int = 0


def distinctive_lines(deleted_code: str, remaining_text: str) -> list[str]:
    """Lines of the deleted code that a copy of it would hold and the task tree does not."""
    kept = {line.strip() for line in remaining_text.splitlines()}
    found = []
    for raw in deleted_code.splitlines():
        line = raw.strip()
        words = set(_WORD.findall(line)) - _PLAIN
        if len(line) >= _MIN_CHARS and words and line not in kept and line not in found:
            found.append(line)
    return found


def copy_threshold(lines: Sequence[str]) -> int:
    """How many of a candidate's lines one file must hold to be a copy of it: half of them.
    A copy holds them all, an edited or older version most (and still gives the answer
    away); code that merely does similar things shares a few common lines (measured: 4 of
    32, 8 of 51 against the standard library)."""
    return max(1, math.ceil(len(lines) / 2))


def sweep(
    groups: Mapping[str, Sequence[str]],
    modules: Sequence[str] = (),
    dependencies: Sequence[str] = (),
    timeout_s: float = 600.0,
) -> SweepResult:
    """Run the sweep in a sandbox with a test run's view for ``dependencies``."""
    spec = {
        "groups": {name: list(lines) for name, lines in groups.items() if lines},
        "threshold": {name: copy_threshold(lines) for name, lines in groups.items()},
        "modules": list(modules),
        "site": SITE_DIR,
    }
    runtime = pytest_runtime(dependencies)
    with tempfile.TemporaryDirectory(prefix="cstack-sweep-") as scratch:
        needles, empty = Path(scratch, "needles.json"), Path(scratch, "tree")
        needles.write_text(json.dumps(spec))
        empty.mkdir()
        mounts = [Mount(_SCRIPT, f"{_DIR}/leak_sweep.py"), Mount(needles, f"{_DIR}/needles.json")]
        argv = [runtime.interpreter, "-I", "-S", f"{_DIR}/leak_sweep.py", f"{_DIR}/needles.json"]
        limits = RunLimits(wall_time_s=timeout_s, cpu_time_s=math.ceil(timeout_s),
                           max_memory_bytes=4 * 1024**3)  # fmt: skip
        done = run_isolated(argv, empty, limits, {}, mounts=mounts, runtime=runtime)
    lines = done.output.decode(errors="replace").strip().splitlines()
    if done.timed_out or done.returncode != 0 or not lines:
        raise SweepFailed(f"the leak sweep failed (status {done.returncode}): {lines[-1:]}")
    try:
        result = json.loads(lines[-1])
    except ValueError:
        raise SweepFailed(f"the leak sweep printed no result: {lines[-1][:200]!r}") from None
    return SweepResult(result["copies"], result["importable"], int(result["files"]))
