"""How many feature-deletion tasks a policy could look up: the old sandbox against today's.

For each codebase (an sdist from PyPI), every feature the builder would try (its first
``--max-candidates``, as `cstack tasks build` ranks them) is checked for a copy of its
deleted lines (``training.rl.tasks.leaks``: half of its distinctive lines in one file):

* old view: what the sandbox mounted before it got an allow-list: all of ``/usr``, the
  interpreter's prefix and the virtualenv, read whole (the sweep run outside a sandbox
  over those roots);
* today's view: the sweep inside today's sandbox, as the builder runs it.

    .venv/bin/python bench/task_leaks.py --pypi inflection==0.5.1 --pypi toolz==1.2.0 ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from training.rl.tasks.builder import _ranked
from training.rl.tasks.deletion import candidates, delete_feature
from training.rl.tasks.dependencies import declared_dependencies
from training.rl.tasks.layout import discover
from training.rl.tasks.leaks import copy_threshold, distinctive_lines, sweep
from training.rl.tasks.pypi import fetch_sdist

SWEEP = Path(__file__).resolve().parents[1] / "training" / "rl" / "agent" / "leak_sweep.py"
OLD_ROOTS = sorted({"/usr", sys.base_prefix, sys.prefix})


def old_view(groups: dict[str, list[str]]) -> dict[str, list[str]]:
    spec = {"groups": groups, "threshold": {k: copy_threshold(v) for k, v in groups.items()},
            "roots": OLD_ROOTS}  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".json") as needles:
        json.dump(spec, needles)
        needles.flush()
        done = subprocess.run([sys.executable, "-I", "-S", str(SWEEP), needles.name],
                              capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])["copies"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pypi", action="append", required=True, help="NAME==VERSION")
    parser.add_argument("--max-candidates", type=int, default=30)
    parser.add_argument("--cache", type=Path, default=Path(".cstack/sdists"))
    args = parser.parse_args()
    groups: dict[str, list[str]] = {}
    dependencies: set[str] = set()
    with tempfile.TemporaryDirectory() as scratch:
        for requirement in args.pypi:
            source = fetch_sdist(requirement, Path(scratch) / requirement, args.cache)
            layout = discover(source)
            tests = "\n".join((source / p).read_text(errors="replace") for p in layout.test_files)
            found = _ranked(list(candidates(source, layout.source_files)), tests, ())
            texts = "\n".join(p.read_text(errors="replace") for p in source.rglob("*.py"))
            for candidate in found[: args.max_candidates]:
                deleted = delete_feature(source, candidate.feature).deleted_code
                lines = distinctive_lines(deleted, texts.replace(deleted, ""))
                groups[f"{requirement} {candidate.feature.name}"] = lines
            own = sorted({Path(p).parts[0].removesuffix(".py") for p in layout.source_files})
            dependencies |= set(declared_dependencies(source, own))
    # One pass over each view for every codebase: reading the old view takes minutes.
    old = old_view(groups)
    today = sweep(groups, dependencies=sorted(dependencies)).copies
    print("| codebase | features | copies readable (old view) | (today) | where (old view) |")
    print("| --- | --- | --- | --- | --- |")
    totals = [0, 0, 0]
    for requirement in args.pypi:
        mine = [name for name in groups if name.split(" ", 1)[0] == requirement]
        leaked_old = [name for name in mine if name in old]
        leaked_today = [name for name in mine if name in today]
        where = sorted({Path(p.split("!")[0]).parent.as_posix()
                        for name in leaked_old for p in old[name]})  # fmt: skip
        shown = ", ".join(where[:3]) + (" ..." if len(where) > 3 else "")
        print(
            f"| {requirement} | {len(mine)} | {len(leaked_old)} | {len(leaked_today)} | {shown} |"
        )
        totals = [totals[0] + len(mine), totals[1] + len(leaked_old), totals[2] + len(leaked_today)]
    print(f"| **total** | {totals[0]} | {totals[1]} | {totals[2]} | |")


if __name__ == "__main__":
    main()
