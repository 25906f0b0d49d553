"""Task builds spread over Celery workers: the same codebases built by 1 and by N workers.

One run fetches the codebases' sdists into the sdist cache the workers read, starts an
embedded Valkey, then for N workers and then for one: that many `cstack worker tasks`
processes (one build each at a time), `cstack tasks build --celery` over the given
codebases into a fresh folder, and the wall time until its last outcome. It prints the
times and the speed-up, and checks that both builds kept the same tasks. Builds are
smaller than `tasks build`'s defaults (``--max-tasks``, ``--max-candidates``, no harder
variants) to keep the run short.

    .venv/bin/python bench/task_build_spread.py --workers 2 \\
        --pypi inflection==0.5.1 --pypi toolz==1.2.0 --pypi termcolor==2.5.0 \\
        --pypi isodate==0.7.2
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from serving.valkey import start_valkey
from training.rl.tasks.pypi import fetch_sdist
from training.settings import TrainingSettings

CSTACK = [sys.executable, "-m", "deploy.cli"]


def build(
    env: dict[str, str], workers: int, codebases: list[str], out: Path, extra: list[str]
) -> float:
    logs = Path(tempfile.mkdtemp(prefix="cstack-spread-"))
    processes = [
        subprocess.Popen(
            [*CSTACK, "worker", "tasks"],
            env=env, stdout=(logs / f"worker-{i}.log").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for i in range(workers)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not all("ready." in (logs / f"worker-{i}.log").read_text() for i in range(workers)):
            if time.monotonic() > deadline:
                raise SystemExit(f"workers never got ready; logs in {logs}")
            time.sleep(0.2)
        command = [*CSTACK, "tasks", "build", "--celery", "--out", str(out), *extra]
        for codebase in codebases:
            command += ["--pypi", codebase]
        started = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"the build failed ({done.returncode}): {done.stderr.strip()}")
        print(done.stdout.strip().splitlines()[-1])
        return elapsed
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pypi", action="append", required=True, help="NAME==VERSION")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-tasks", type=int, default=3)
    parser.add_argument("--max-candidates", type=int, default=6)
    args = parser.parse_args()
    extra = [
        "--max-tasks", str(args.max_tasks), "--max-candidates", str(args.max_candidates),
        "--no-harder-variants",
    ]  # fmt: skip
    cache = TrainingSettings().tasks_sdist_cache
    with tempfile.TemporaryDirectory() as scratch:  # the sdist cache warm for both runs
        for codebase in args.pypi:
            fetch_sdist(codebase, Path(scratch) / codebase, cache)
    server = start_valkey()
    try:
        times, kept = {}, {}
        # N workers first: whatever the first build warms up counts against them, so the
        # speed-up printed errs low.
        for workers in (args.workers, 1):
            out = Path(tempfile.mkdtemp(prefix="cstack-spread-out-"))
            env = {
                **os.environ,
                "CSTACK_REDIS_URL": server.connection_url,
                "CSTACK_TASKS_BUILD_QUEUE": f"tasks-build-{uuid.uuid4().hex[:8]}",
            }
            times[workers] = build(env, workers, args.pypi, out, extra)
            kept[workers] = sorted(p.name for p in out.iterdir() if (p / "task.json").is_file())
        if kept[1] != kept[args.workers]:
            raise SystemExit("the two builds kept different tasks")
        print(f"{len(args.pypi)} codebases, {len(kept[1])} tasks, {os.cpu_count()} CPUs")
        for workers, seconds in sorted(times.items()):
            print(f"  {workers} worker(s): {seconds:6.1f} s")
        print(f"  speed-up with {args.workers}: x{times[1] / times[args.workers]:.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
