"""Build feature-deletion tasks from a repository with a passing test suite.

For each candidate feature: delete it in a fresh copy, run the suite, keep the task if at
least one test went pass->fail (FAIL_TO_PASS) and at least one still passes
(PASS_TO_PASS), then scrub the copy and prove with a canary scan that the deleted code
is nowhere in it. The harness keeps the original test files outside the sandbox.

Each kept task then gets a harder variant where it can: its feature and the next kept
task's deleted together, kept if strictly more tests fail than for the task alone. The
RL curriculum adds a variant to the draw once its task is solved.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from training.tasks.deletion import Candidate, canaries, candidates, delete_feature
from training.tasks.layout import RepoLayout, discover
from training.tasks.scrub import CanaryHit, canary_scan, installed_copy, scrub
from training.tasks.spec import Feature, TaskSpec
from training.tasks.suite import run_suite

TASK_FILE = "task.json"
#: One JSON line per codebase built into a task folder (``cstack tasks stats`` reads it).
BUILD_LOG = "builds.jsonl"


class TaskBuildError(RuntimeError):
    """The repository cannot give tasks (no passing baseline, installed copy, ...)."""


@dataclass(frozen=True)
class BuildConfig:
    max_tasks: int = 5
    max_candidates: int = 25
    timeout_s: float = 300.0
    only: tuple[str, ...] = ()
    source_name: str = ""
    #: Build a harder variant of each kept task (two features deleted at once).
    harder_variants: bool = True


@dataclass
class BuildReport:
    tasks: list[TaskSpec] = field(default_factory=list)
    #: Harder variants of ``tasks`` (not counted among them).
    variants: list[TaskSpec] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    scrubbed: list[str] = field(default_factory=list)
    baseline_passed: int = 0
    candidates: int = 0


def _text_of(tree: Path) -> str:
    parts = []
    for path in sorted(tree.rglob("*")):
        if path.is_file():
            parts.append(path.read_bytes().decode("utf-8", errors="replace"))
    return "\n".join(parts)


def _ranked(found: list[Candidate], test_text: str, only: tuple[str, ...]) -> list[Candidate]:
    """Features the tests mention first, then bigger bodies; ``only`` filters by name."""
    if only:
        found = [c for c in found if c.feature.name in only]

    def key(candidate: Candidate) -> tuple[int, int]:
        leaf = candidate.feature.name.rsplit(".", 1)[-1]
        mentioned = bool(re.search(rf"\b{re.escape(leaf)}\b", test_text))
        return (0 if mentioned else 1, -candidate.body_lines)

    return sorted(found, key=key)


def _check_not_installed(layout: RepoLayout) -> None:
    tops = {Path(p).parts[0].removesuffix(".py") for p in layout.source_files}
    for top in sorted(tops):
        origin = installed_copy(top)
        if origin:
            raise TaskBuildError(
                f"package {top!r} is importable from {origin}: an installed copy would leak "
                "the deleted code; build in an environment without it"
            )


def build_tasks(
    repo: Path, out: Path, config: BuildConfig, log: Callable[[str], None] = lambda _: None
) -> BuildReport:
    """Write each kept task to ``out/<task_id>/`` (``repo/``, ``harness/``, task.json)."""
    repo, out = Path(repo).resolve(), Path(out).resolve()
    report = BuildReport()
    with tempfile.TemporaryDirectory(prefix="cstack-tasks-") as scratch:
        clean = Path(scratch) / "clean"
        shutil.copytree(repo, clean, symlinks=True)
        report.scrubbed = scrub(clean)
        layout = discover(clean)
        _check_not_installed(layout)
        baseline = run_suite(clean, layout.python_paths, timeout_s=config.timeout_s)
        report.baseline_passed = len(baseline.passed)
        log(f"baseline: {len(baseline.passed)}/{len(baseline.outcomes)} tests pass")
        if not baseline.passed:
            raise TaskBuildError(f"no test passes in {repo} before any deletion")
        test_text = "\n".join((clean / p).read_text(errors="replace") for p in layout.test_files)
        ranked = _ranked(list(candidates(clean, layout.source_files)), test_text, config.only)
        for candidate in ranked[: config.max_candidates]:
            if len(report.tasks) >= config.max_tasks:
                break
            report.candidates += 1
            name = candidate.feature.name
            task_id = _task_id(config.source_name or clean.name, candidate.feature)
            task, reason = _try_deletion(
                clean, layout, [candidate.feature], baseline.passed, out, config, task_id
            )
            if task is None:
                report.rejected.append((name, reason))
            else:
                report.tasks.append(task)
            log(f"{candidate.feature.kind} {candidate.feature.path}:{name}: {reason or 'kept'}")
        if config.harder_variants and len(report.tasks) > 1:
            _build_variants(clean, layout, baseline.passed, out, config, report, log)
    _log_build(out, config.source_name or repo.name, report)
    return report


def _build_variants(
    clean: Path,
    layout: RepoLayout,
    baseline_passed: set[str],
    out: Path,
    config: BuildConfig,
    report: BuildReport,
    log: Callable[[str], None],
) -> None:
    """Each kept task's harder variant: its feature and the next kept one's deleted."""
    singles = list(report.tasks)
    for index, single in enumerate(singles):
        partner = singles[(index + 1) % len(singles)]
        variant_id = f"{single.task_id}+{_slug(partner.feature.name)}"
        variant, reason = _try_deletion(
            clean, layout, [single.feature, partner.feature], baseline_passed, out, config,
            variant_id, harder_than=single,
        )  # fmt: skip
        log(f"harder variant {variant_id}: {reason or 'kept'}")
        if variant is None:
            continue
        report.variants.append(variant)
        updated = single.model_copy(update={"harder": variant.task_id})
        report.tasks[index] = updated
        (out / single.task_id / TASK_FILE).write_text(updated.model_dump_json(indent=2))


def _log_build(out: Path, source: str, report: BuildReport) -> None:
    _append_build_log(
        out,
        {
            "source": source,
            "baseline_passed": report.baseline_passed,
            "candidates": report.candidates,
            "kept": [task.task_id for task in report.tasks],
            "variants": [task.task_id for task in report.variants],
            "rejected": [list(pair) for pair in report.rejected],
        },
    )


def log_failed_build(out: Path, source: str, reason: str) -> None:
    """Record that ``source`` gave no tasks at all, and why (``cstack tasks stats``)."""
    _append_build_log(
        Path(out).resolve(),
        {"source": source, "baseline_passed": 0, "candidates": 0, "kept": [], "rejected": [],
         "failed": reason},
    )  # fmt: skip


def _append_build_log(out: Path, entry: dict[str, object]) -> None:
    entry = {**entry, "at": datetime.now(UTC).isoformat(timespec="seconds")}
    out.mkdir(parents=True, exist_ok=True)
    with (out / BUILD_LOG).open("a") as log:
        log.write(json.dumps(entry) + "\n")


def _task_id(source: str, feature: Feature) -> str:
    return _slug(f"{source}__{feature.path.removesuffix('.py')}__{feature.name}")


def _slug(raw: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)


def _try_deletion(
    clean: Path,
    layout: RepoLayout,
    features: list[Feature],
    baseline_passed: set[str],
    out: Path,
    config: BuildConfig,
    task_id: str,
    harder_than: TaskSpec | None = None,
) -> tuple[TaskSpec | None, str]:
    """Build the task that deletes ``features``: ``(task, "")`` when kept, else
    ``(None, why)``. A harder variant must fail strictly more tests than its task."""
    with tempfile.TemporaryDirectory(prefix="cstack-cand-") as scratch:
        work = Path(scratch) / "repo"
        shutil.copytree(clean, work, symlinks=True)
        deleted = []
        for feature in features:  # each deleted from what the ones before left
            deletion = delete_feature(work, feature)
            for path, text in deletion.new_sources.items():
                if text is None:
                    (work / path).unlink()
                else:
                    (work / path).write_text(text)
            deleted.append(deletion.deleted_code)
        after = run_suite(work, layout.python_paths, timeout_s=config.timeout_s)
        if after.timed_out:
            return None, "suite timed out after the deletion"
        fail_to_pass = sorted(baseline_passed - after.passed)
        pass_to_pass = sorted(baseline_passed & after.passed)
        if not fail_to_pass:
            return None, "no test goes from pass to fail"
        if not pass_to_pass:
            return None, "no test stays passing"
        if harder_than is not None and not set(fail_to_pass) > set(harder_than.fail_to_pass):
            return None, "no more tests fail than for the task alone"
        deleted_code = "\n".join(deleted)
        tokens = canaries(deleted_code, _text_of(work))
        if not tokens:
            return None, "deleted code has no distinctive token to scan for"
        task = TaskSpec(
            task_id=task_id,
            source=config.source_name,
            feature=features[0],
            also_removed=features[1:],
            variant_of=harder_than.task_id if harder_than else None,
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
            test_files=layout.test_files,
            canaries=tokens,
            python_paths=layout.python_paths,
        )
        hits = _write_task(work, clean, task, deleted_code, out)
    if hits:
        return (
            None,
            f"canary scan found {len(hits)} leaks, first {hits[0].canary!r} in {hits[0].path}",
        )
    return task, ""


def _write_task(
    work: Path, clean: Path, task: TaskSpec, deleted_code: str, out: Path
) -> list[CanaryHit]:
    task_dir = out / task.task_id
    if task_dir.exists():
        shutil.rmtree(task_dir)
    sandbox = task_dir / "repo"
    shutil.copytree(work, sandbox, symlinks=True)
    scrub(sandbox)
    hits = canary_scan(sandbox, task.canaries)
    if hits:
        shutil.rmtree(task_dir)
        return hits
    originals = task_dir / "harness" / "original"
    for relative in task.test_files:
        target = originals / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(clean / relative, target)
    (task_dir / "harness" / "deleted_code.txt").write_text(deleted_code)
    (task_dir / TASK_FILE).write_text(task.model_dump_json(indent=2))
    return []


def load_task(task_dir: Path) -> TaskSpec:
    return TaskSpec.model_validate_json((Path(task_dir) / TASK_FILE).read_text())
