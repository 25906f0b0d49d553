"""Build feature-deletion tasks from a repository with a passing test suite.

For each candidate feature: delete it in a fresh copy, run the suite, keep the task if at
least one test went pass->fail (FAIL_TO_PASS) and at least one still passes
(PASS_TO_PASS), then scrub the copy and prove with a canary scan that the deleted code
is nowhere in it. Before any of that, a sweep inside the sandbox (``training.rl.tasks.leaks``)
looks for each candidate's deleted lines in everything a test run can read, and for the
codebase's own modules on its module path: a candidate found there is not tried, a
codebase importable from outside its tree is not built. The harness keeps the original
test files, and the original files of the deleted feature (``harness/solution/``, a clean
solution for audits), outside the sandbox.

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

from training.rl.tasks.deletion import Candidate, Deletion, canaries, candidates, delete_feature
from training.rl.tasks.dependencies import declared_dependencies
from training.rl.tasks.layout import RepoLayout, discover
from training.rl.tasks.leaks import distinctive_lines, sweep
from training.rl.tasks.scrub import CanaryHit, canary_scan, scrub
from training.rl.tasks.spec import Feature, TaskSpec
from training.rl.tasks.suite import run_suite

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


def _own_modules(layout: RepoLayout) -> list[str]:
    roots = [p.rstrip("/") + "/" for p in layout.python_paths if p not in ("", ".")]
    tops = set()
    for path in layout.source_files:
        relative = next((path[len(r) :] for r in roots if path.startswith(r)), path)
        tops.add(Path(relative).parts[0].removesuffix(".py"))
    return sorted(tops)


def _leaked(clean: Path, found: list[Candidate], dependencies: list[str]) -> dict[str, list[str]]:
    """Candidate name -> where the sandbox can read a copy of its deleted code."""
    texts = {
        p.relative_to(clean).as_posix(): p.read_bytes().decode("utf-8", errors="replace")
        for p in sorted(clean.rglob("*"))
        if p.is_file()
    }
    groups = {}
    for candidate in found:
        deletion = delete_feature(clean, candidate.feature)
        remaining = {**texts, **{k: v or "" for k, v in deletion.new_sources.items()}}
        groups[candidate.feature.name] = distinctive_lines(
            deletion.deleted_code, "\n".join(remaining.values())
        )
    return sweep(groups, dependencies=dependencies).copies


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
        own = _own_modules(layout)
        dependencies = declared_dependencies(clean, own)
        importable = sweep({}, modules=own, dependencies=dependencies).importable
        if importable:
            module, origin = next(iter(importable.items()))
            raise TaskBuildError(
                f"module {module!r} is importable in the sandbox from {origin}: that copy "
                "would leak the deleted code; build where the sandbox does not see it"
            )
        log(f"dependencies seen by test runs: {', '.join(dependencies) or 'none'}")
        baseline = run_suite(
            clean, layout.python_paths, timeout_s=config.timeout_s, dependencies=dependencies
        )
        report.baseline_passed = len(baseline.passed)
        log(f"baseline: {len(baseline.passed)}/{len(baseline.outcomes)} tests pass")
        if not baseline.passed:
            raise TaskBuildError(f"no test passes in {repo} before any deletion")
        test_text = "\n".join((clean / p).read_text(errors="replace") for p in layout.test_files)
        ranked = _ranked(list(candidates(clean, layout.source_files)), test_text, config.only)
        ranked = ranked[: config.max_candidates]
        leaked = _leaked(clean, ranked, dependencies)
        for candidate in ranked:
            if len(report.tasks) >= config.max_tasks:
                break
            report.candidates += 1
            name = candidate.feature.name
            task_id = _task_id(config.source_name or clean.name, candidate.feature)
            if name in leaked:
                task, reason = None, f"deleted code readable in the sandbox at {leaked[name][0]}"
            else:
                task, reason = _try_deletion(
                    clean, layout, [candidate.feature], baseline.passed, out, config, task_id,
                    dependencies=dependencies,
                )  # fmt: skip
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
            variant_id, harder_than=single, dependencies=single.dependencies,
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
    dependencies: list[str] | None = None,
) -> tuple[TaskSpec | None, str]:
    """Build the task that deletes ``features``: ``(task, "")`` when kept, else
    ``(None, why)``. A harder variant must fail strictly more tests than its task."""
    with tempfile.TemporaryDirectory(prefix="cstack-cand-") as scratch:
        work = Path(scratch) / "repo"
        shutil.copytree(clean, work, symlinks=True)
        deletions: list[Deletion] = []
        for feature in features:  # each deleted from what the ones before left
            deletion = delete_feature(work, feature)
            for path, text in deletion.new_sources.items():
                if text is None:
                    (work / path).unlink()
                else:
                    (work / path).write_text(text)
            deletions.append(deletion)
        after = run_suite(
            work, layout.python_paths, timeout_s=config.timeout_s, dependencies=dependencies or []
        )
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
        deleted_code = "\n".join(d.deleted_code for d in deletions)
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
            dependencies=dependencies or [],
        )
        touched = sorted({path for d in deletions for path in d.new_sources})
        hits = _write_task(work, clean, task, deleted_code, touched, out)
    if hits:
        return (
            None,
            f"canary scan found {len(hits)} leaks, first {hits[0].canary!r} in {hits[0].path}",
        )
    return task, ""


def _write_task(
    work: Path, clean: Path, task: TaskSpec, deleted_code: str, touched: list[str], out: Path
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
    for relative in touched:  # the files as they were: one clean solution
        target = task_dir / "harness" / "solution" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(clean / relative, target)
    (task_dir / "harness" / "deleted_code.txt").write_text(deleted_code)
    (task_dir / TASK_FILE).write_text(task.model_dump_json(indent=2))
    return []


def load_task(task_dir: Path) -> TaskSpec:
    return TaskSpec.model_validate_json((Path(task_dir) / TASK_FILE).read_text())
