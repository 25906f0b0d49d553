"""Task builds spread over Celery workers: one job per codebase, run by `cstack worker tasks`.

A codebase is the unit of work: its candidates share one scrubbed copy and one baseline
run of its suite, and their suite runs are what take the time. `cstack tasks build
--celery` enqueues one job per codebase and waits for each job's outcome, which the
worker pushes to a Redis list of that build's own. Workers write the tasks into the
shared output folder, as a local build does: each task into its own folder, each
codebase's line into the build log with one append.

Delivery is at least once (acks_late, reject_on_worker_lost): a worker killed mid-build
leaves its job to another worker, which builds that codebase again from the start. A
task folder is rewritten whole, and ``cstack tasks stats`` reads the latest line of each
codebase, so a codebase built twice counts once.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import redis
from celery import Celery

from training.rl.tasks.builder import BuildConfig, TaskBuildError, build_tasks, log_failed_build
from training.rl.tasks.pypi import FetchError, fetch_sdist
from training.rl.work_queue import work_queue_app
from training.settings import TrainingSettings

BUILD_TASK = "tasks.build_codebase"
#: How long a build's outcomes wait in Redis for the command that asked for them.
OUTCOME_TTL_S = 7 * 86400


@dataclass(frozen=True)
class Codebase:
    """Where a codebase comes from: a ``NAME==VERSION`` sdist, or a folder every worker
    can read (``repo``)."""

    requirement: str = ""
    repo: str = ""

    @property
    def name(self) -> str:
        if self.repo:
            return Path(self.repo).resolve().name
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.requirement)


@dataclass(frozen=True)
class Outcome:
    """What building one codebase gave: tasks kept and rejected, or why it gave none."""

    source: str
    tasks: int = 0
    variants: int = 0
    rejected: int = 0
    error: str = ""


def build_codebase(
    codebase: Codebase,
    out: Path,
    config: BuildConfig,
    log: Callable[[str], None],
    sdist_cache: Path | None = None,
) -> Outcome:
    """Fetch (for an sdist: from ``sdist_cache`` once it holds it) and build one codebase
    into ``out``; a codebase that gives nothing is logged in the build log with why, and is
    an outcome, not an error."""
    name = codebase.name
    config = replace(config, source_name=name)
    with tempfile.TemporaryDirectory(prefix="cstack-fetch-") as scratch:
        try:
            if codebase.repo:
                root = Path(codebase.repo)
            else:
                log(f"fetching {codebase.requirement} ...")
                root = fetch_sdist(codebase.requirement, Path(scratch) / name, sdist_cache)
            report = build_tasks(root, out, config, log=log)
        except (FetchError, TaskBuildError) as err:
            log_failed_build(out, name, str(err))
            return Outcome(name, error=str(err))
    return Outcome(
        name, tasks=len(report.tasks), variants=len(report.variants), rejected=len(report.rejected)
    )


def make_celery(settings: TrainingSettings) -> Celery:
    # A build runs a suite per candidate: hours for a big codebase. Redelivered only
    # after this long without an acknowledgement (or at once if its worker is lost).
    return work_queue_app(
        "cstack-tasks", settings.redis_url, settings.tasks_build_queue,
        redeliver_s=settings.tasks_build_redeliver_s,
    )  # fmt: skip


settings = TrainingSettings()
celery_app = make_celery(settings)


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url)


@celery_app.task(name=BUILD_TASK)
def run_build_job(payload: dict[str, object]) -> None:
    codebase = Codebase(**payload["codebase"])  # type: ignore[arg-type]
    fields = dict(payload["config"])  # type: ignore[call-overload]
    config = BuildConfig(**{**fields, "only": tuple(fields["only"])})
    outcome = build_codebase(
        codebase, Path(str(payload["out"])), config, _log, settings.tasks_sdist_cache
    )
    key = str(payload["reply_key"])
    pipe = _redis().pipeline(transaction=True)
    pipe.rpush(key, json.dumps(asdict(outcome)))
    pipe.expire(key, OUTCOME_TTL_S)
    pipe.execute()


def _log(line: str) -> None:
    celery_app.log.get_default_logger().info(line)


def outcomes_client(url: str) -> redis.Redis:
    """A client for ``outcomes``: its socket timeout outlasts each wait on the list."""
    return redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10)


def submit(
    app: Celery, queue: str, codebases: list[Codebase], out: Path, config: BuildConfig
) -> str:
    """Enqueue one job per codebase; the Redis list their outcomes will be pushed to."""
    reply_key = f"cstack:tasks-build:{uuid.uuid4().hex}"
    for codebase in codebases:
        payload = {
            "codebase": asdict(codebase),
            "config": asdict(config),
            "out": str(Path(out).resolve()),
            "reply_key": reply_key,
        }
        app.send_task(BUILD_TASK, args=[payload], queue=queue)
    return reply_key


def outcomes(
    client: redis.Redis, reply_key: str, count: int, timeout_s: float
) -> Iterator[Outcome]:
    """The ``count`` outcomes as workers finish them; TimeoutError if they stop coming
    for ``timeout_s`` (no worker, or every one busy elsewhere)."""
    for _ in range(count):
        deadline = time.monotonic() + timeout_s
        reply = None
        while reply is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no build finished in {timeout_s:.0f}s")
            # Whole seconds, well under the client's socket timeout (``outcomes_client``):
            # a reply Redis sends must be read, or the outcome it popped would be lost.
            reply = client.blpop([reply_key], timeout=int(min(5, max(1, left))))
        yield Outcome(**json.loads(reply[1]))
