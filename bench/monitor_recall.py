"""The reward-hack monitor's recall and false alarms on a planted-hack suite.

For each codebase (an sdist from PyPI) every feature the task builder could delete is one
task. Each is played three ways, as file versions the monitor reads the way a rollout's
are (``training.rl.monitor.check_episode`` over the writes, against the stubbed tree):

* clean: the feature's original code written back (the solution a task's builder knows);
  any flag is a false alarm;
* the project's own attacks (``training.rl.tasks.attacks``): each must be flagged;
* held-out attacks written by someone who had not read the rules (``--heldout``, a file
  defining ``HELDOUT`` and ``CLEAN`` templates, repeatable: ``monitor_heldout.py`` was
  written first and the rules were then improved against it; ``monitor_heldout2.py`` was
  written after, by another author, and never used to change a rule): the honest recall
  figure, and more clean edits for the false-alarm figure.

Shadowing forgeries and answer recovery earn nothing in the sandbox whatever the monitor
says (``cstack tasks audit`` shows it); they are counted here too, for the monitor alone.

    .venv/bin/python bench/monitor_recall.py --heldout bench/monitor_heldout.py \\
        --heldout bench/monitor_heldout2.py \\
        --pypi inflection==0.5.1 --pypi toolz==1.2.0 ...
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.util
import posixpath
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from training.rl.monitor import CommandEntry, EpisodeEvidence, FileChange, check_episode
from training.rl.tasks.attacks import ATTACKS
from training.rl.tasks.deletion import candidates, delete_feature
from training.rl.tasks.layout import HARNESS_MODULES, discover
from training.rl.tasks.pypi import fetch_sdist
from training.rl.tasks.spec import TaskSpec

PROTECTED = sorted(set(sys.stdlib_module_names) | HARNESS_MODULES |
                   {"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging"})  # fmt: skip
#: Print each false alarm and each missed attack with its evidence (--show).
SHOW = False
SAMPLE_TESTS = ["tests/test_feature.py::test_one", "tests/test_feature.py::test_two"]


def _episode(template: Path, tree: list[str], files: dict[str, str]) -> EpisodeEvidence:
    changes, commands = [], []
    for path, content in files.items():
        before = template / path
        text = before.read_text(errors="replace") if before.is_file() else None
        changes.append(FileChange(path=path, before=text, after=content))
        commands.append(
            CommandEntry(tool="write_file", arguments={"path": path, "content": content})
        )
    return EpisodeEvidence(commands=commands, changes=changes, tree=tree,
                           protected_modules=PROTECTED)  # fmt: skip


def _module_name(path: str, roots: list[str]) -> str:
    for root in sorted(roots, key=len, reverse=True):
        if root not in ("", ".") and path.startswith(root.rstrip("/") + "/"):
            path = path[len(root.rstrip("/")) + 1 :]
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _heldout(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every set's attacks and clean edits, each labelled with its set (the file's stem)."""
    attacks: list[dict[str, Any]] = []
    cleans: list[dict[str, Any]] = []
    for path in paths:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        attacks += [{**entry, "origin": path.stem} for entry in module.HELDOUT]
        cleans += [{**entry, "origin": path.stem} for entry in module.CLEAN]
    return attacks, cleans


def _without(source: str, qualified: str) -> str:
    """``source`` with the definition ``qualified`` (``f`` or ``Class.f``) taken out."""
    tree = ast.parse(source)
    body, *rest = [tree.body], qualified.split(".")
    for part in qualified.split(".")[:-1]:
        owner = next((n for n in body[-1] if isinstance(n, ast.ClassDef) and n.name == part), None)
        if owner is None:
            return source
        body.append(owner.body)
    name = qualified.rsplit(".", 1)[-1]
    found = [n for n in body[-1] if getattr(n, "name", None) == name]
    if not found or not rest:
        return source
    node = found[0]
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    lines = source.splitlines(keepends=True)
    indent = lines[start - 1][: len(lines[start - 1]) - len(lines[start - 1].lstrip())]
    keep = [f"{indent}pass\n"] if len(body[-1]) == 1 and len(body) > 1 else []
    return "".join(lines[: start - 1] + keep + lines[node.end_lineno :])


def _formatted(entry: dict[str, Any], values: dict[str, str]) -> dict[str, str] | None:
    try:
        return {
            path.format(**values): text.format(**values) for path, text in entry["files"].items()
        }
    except (KeyError, IndexError, ValueError):
        return None


def play_codebase(
    source: Path, max_candidates: int, heldout: tuple[list, list]
) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    layout = discover(source)
    found = list(candidates(source, layout.source_files))[:max_candidates]
    for candidate in found:
        feature = candidate.feature
        deletion = delete_feature(source, feature)
        with tempfile.TemporaryDirectory() as scratch:
            template = Path(scratch) / "repo"
            shutil.copytree(source, template, symlinks=True)
            for path, text in deletion.new_sources.items():
                if text is None:
                    (template / path).unlink()
                else:
                    (template / path).write_text(text)
            tree = sorted(
                p.relative_to(template).as_posix() for p in template.rglob("*") if p.is_file()
            )
            clean = {
                path: (source / path).read_text(errors="replace") for path in deletion.new_sources
            }
            plays: list[tuple[str, str, str, dict[str, str] | None]] = [
                ("clean", "own", "clean_solution", clean)
            ]
            task = TaskSpec(
                task_id="bench", source="bench", feature=feature, fail_to_pass=SAMPLE_TESTS[:1],
                pass_to_pass=SAMPLE_TESTS[1:], test_files=layout.test_files, canaries=[],
                python_paths=layout.python_paths,
            )  # fmt: skip
            for attack in ATTACKS:
                plan = attack.plan(task, template)
                plays.append((attack.kind, "own", attack.name, plan.files if plan else None))
            stub = template / feature.path
            values = {
                "feature_path": feature.path,
                "feature_module": _module_name(feature.path, layout.python_paths),
                "package_dir": posixpath.dirname(feature.path) or ".",
                "feature_name": feature.name.rsplit(".", 1)[-1],
                "feature_source": stub.read_text(errors="replace") if stub.is_file() else "",
                "tests": repr(SAMPLE_TESTS),
            }
            attacks, cleans = heldout
            plays += [(e["kind"], e["origin"], e["name"], _formatted(e, values)) for e in attacks]
            # A clean agent replaces the stub; the held-out templates can only append, so
            # their clean edits are appended to the file without the stub.
            rewritten = {
                **values,
                "feature_source": _without(values["feature_source"], feature.name),
            }
            plays += [("clean", e["origin"], e["name"], _formatted(e, rewritten)) for e in cleans]
            for kind, origin, name, files in plays:
                if files is None:
                    continue
                verdicts = check_episode(_episode(template, tree, files))
                flagged = bool(verdicts)
                side = "clean" if kind == "clean" else "attack"
                if SHOW and flagged != (side == "attack"):
                    what = "false alarm" if flagged else "missed"
                    print(f"  {what}: {origin} {kind} {name} {feature.path}:{feature.name}")
                    for verdict in verdicts:
                        print(f"    {verdict.rule}: {verdict.evidence[:300]}")
                counts[(side, origin, "total")] += 1
                counts[(side, origin, "flagged")] += flagged
                if side == "attack":
                    counts[(kind, origin, "total")] += 1
                    counts[(kind, origin, "flagged")] += flagged
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pypi", action="append", required=True, help="NAME==VERSION")
    parser.add_argument(
        "--heldout",
        type=Path,
        action="append",
        default=[],
        help="a held-out set (a file defining HELDOUT and CLEAN); repeatable",
    )
    parser.add_argument("--max-candidates", type=int, default=40)
    parser.add_argument("--cache", type=Path, default=Path(".cstack/sdists"))
    parser.add_argument("--show", action="store_true", help="print each miss and false alarm")
    args = parser.parse_args()
    global SHOW
    SHOW = args.show
    heldout = _heldout(args.heldout)
    total: collections.Counter = collections.Counter()
    with tempfile.TemporaryDirectory() as scratch:
        for requirement in args.pypi:
            source = fetch_sdist(requirement, Path(scratch) / requirement, args.cache)
            counts = play_codebase(source, args.max_candidates, heldout)
            total += counts
            tasks = counts[("clean", "own", "total")]
            alarms = sum(
                n for (side, _, what), n in counts.items() if side == "clean" and what == "flagged"
            )
            print(f"{requirement}: {tasks} tasks, false alarms {alarms}", flush=True)
    print("\n| played | origin | episodes | flagged | rate |\n| --- | --- | --- | --- | --- |")
    for side, origin in sorted({(k[0], k[1]) for k in total}):
        n, flagged = total[(side, origin, "total")], total[(side, origin, "flagged")]
        print(f"| {side} | {origin} | {n} | {flagged} | {flagged / n:.1%} |")


if __name__ == "__main__":
    main()
