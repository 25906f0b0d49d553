"""`cstack tasks build --celery`: codebases spread over real Celery workers (`cstack worker
tasks`) through the real Redis, each built once into the shared output folder, a codebase
that gives nothing reported as when built locally, and the stats read from what the
workers logged."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.commands import cstack_command

FIXTURE = Path(__file__).parent / "fixture_repo"


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "CSTACK_REDIS_URL": redis_url,
        "CSTACK_TASKS_BUILD_QUEUE": f"tasks-build-{uuid.uuid4().hex[:8]}",
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture
def workers(env: dict[str, str], tmp_path: Path) -> Iterator[list[Path]]:
    """Two workers, ready; their log files."""
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    processes = [
        subprocess.Popen(
            cstack_command("worker", "tasks", "--loglevel", "info"),
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        for log in logs
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not all("ready." in log.read_text(errors="replace") for log in logs):
            assert time.monotonic() < deadline, "the task-build workers never got ready"
            assert all(p.poll() is None for p in processes), "a task-build worker exited"
            time.sleep(0.2)
        yield logs
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_codebases_are_built_by_the_workers(
    env: dict[str, str], workers: list[Path], tmp_path: Path
) -> None:
    sources = []
    for name in ("alpha", "beta"):
        shutil.copytree(FIXTURE, tmp_path / name)
        sources.append(tmp_path / name)
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURE, broken)
    for test in (broken / "tests").glob("test_*.py"):
        test.write_text("def test_fails():\n    assert False\n")
    out = tmp_path / "tasks"
    command = cstack_command("tasks", "build", "--celery", "--out", str(out), "--max-tasks", "1")
    for source in [*sources, broken]:
        command += ["--repo", str(source)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)

    assert done.returncode == 1, done.stdout + done.stderr  # one codebase gave nothing
    assert "3 builds queued" in done.stdout
    assert "alpha: 1 tasks" in done.stdout and "beta: 1 tasks" in done.stdout
    assert "error: broken: no test passes" in done.stderr
    assert "2 tasks (+0 harder variants) written" in done.stdout
    built = sorted(path.name for path in out.iterdir() if (path / "task.json").is_file())
    assert [name.split("__")[0] for name in built] == ["alpha", "beta"]
    # Both workers took jobs (each takes one at a time; three jobs, two workers).
    for log in workers:
        assert "tasks.build_codebase" in log.read_text(errors="replace")

    stats = subprocess.run(
        cstack_command("tasks", "stats", "--tasks", str(out)),
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    rows = {line.split("\t")[0]: line.split("\t") for line in stats.stdout.splitlines()}
    assert rows["alpha"][3] == "1" and rows["beta"][3] == "1"
    assert rows["broken"][4].startswith("no tasks: no test passes")


def test_without_a_worker_the_build_says_so(env: dict[str, str], tmp_path: Path) -> None:
    command = cstack_command(
        "tasks", "build", "--celery", "--wait", "2", "--out", str(tmp_path / "t"),
        "--repo", str(FIXTURE),
    )  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "no build finished in 2s: is a `cstack worker tasks` running?" in done.stderr
