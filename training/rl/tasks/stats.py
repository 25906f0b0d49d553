"""What task builds gave, per codebase: candidates tried, tasks kept, rejections and why.

Read from the build log ``cstack tasks build`` appends to in its output folder (the
latest build of each codebase counts); a kept task whose folder is gone since is not
counted as kept.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from training.rl.tasks.builder import BUILD_LOG, TASK_FILE


@dataclass(frozen=True)
class CodebaseStats:
    source: str
    baseline_passed: int
    candidates: int
    kept: int
    #: Harder variants of the kept tasks (two features deleted), on disk.
    variants: int = 0
    #: Rejections by reason, the reason's particulars (counts, names) left out.
    rejected: Counter[str] = field(default_factory=Counter)
    #: Why the codebase gave no tasks at all (no passing suite, an installed copy, ...).
    failed: str | None = None


def reason_kind(reason: str) -> str:
    """ "canary scan found 3 leaks, first 'x' in y" -> "canary scan found leaks"."""
    return re.sub(r" \d+ ", " ", reason.split(",")[0])


def build_stats(tasks: Path) -> list[CodebaseStats]:
    """Per codebase, in the order first built; ValueError when there is no build log."""
    log = Path(tasks) / BUILD_LOG
    if not log.is_file():
        raise ValueError(f"{tasks} has no {BUILD_LOG}: not an output folder of `tasks build`")
    latest: dict[str, dict] = {}
    for number, line in enumerate(log.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            latest[str(entry["source"])] = entry
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{log}:{number}: not a build record") from None
    return [
        CodebaseStats(
            source=source,
            baseline_passed=int(entry["baseline_passed"]),
            candidates=int(entry["candidates"]),
            kept=sum((Path(tasks) / task_id / TASK_FILE).is_file() for task_id in entry["kept"]),
            variants=sum(
                (Path(tasks) / task_id / TASK_FILE).is_file()
                for task_id in entry.get("variants", [])
            ),
            rejected=Counter(reason_kind(reason) for _, reason in entry["rejected"]),
            failed=entry.get("failed"),
        )
        for source, entry in latest.items()
    ]
