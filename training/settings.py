"""Settings of the training package (environment prefix ``CSTACK_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr, field_validator

from serving.settings import CstackSettings
from training.rl.feedback import DEFAULT_FEEDBACK_FILE


class TrainingSettings(CstackSettings):
    # --- Trainer core: DCP checkpoints of `cstack train` when --checkpoint-dir is not given
    # (unset: none), and the port rank 0 serves Prometheus metrics on (unset: none) ---
    train_checkpoint_dir: Path | None = None
    trainer_metrics_port: int | None = None

    # --- RL loop (training/rl, agent, rollouts, tasks): owned by the RL engineer ---
    #: Celery broker and trajectory stream (the same CSTACK_REDIS_URL billing reads, unless
    #: that is a Redis Cluster: then a single Redis, as Celery needs).
    #: Where rollouts call the policy: the gateway's OpenAI-compatible API, and its key.
    rl_policy_url: str = "http://127.0.0.1:8000/v1"
    rl_api_key: SecretStr = SecretStr("")
    #: vLLM engines whose weights the trainer updates in place (their own base URLs).
    rl_engine_urls: list[str] = []
    #: The trainer's address the engines' workers connect to for a streamed weight push
    #: (an address they can reach when they run elsewhere); its port is chosen per push.
    rl_weight_sync_host: str = "127.0.0.1"
    rl_trajectory_stream: str = "cstack:rl:trajectories"
    rl_rollout_queue: str = "rollouts"
    #: The queue of `cstack tasks build --celery` (one job per codebase, `cstack worker
    #: tasks` runs them), and how long a job may go unacknowledged before another worker
    #: gets it (a build runs a suite per candidate: hours for a big codebase).
    tasks_build_queue: str = "tasks-build"
    tasks_build_redeliver_s: int = 6 * 3600
    #: Where `cstack tasks build --pypi NAME==VERSION` keeps each sdist after its first
    #: download (per machine: each worker keeps its own), so later builds do not fetch it.
    tasks_sdist_cache: Path = Path(".cstack/sdists")
    #: Hard time limit of one rollout; the broker redelivers an unacked one after
    #: ``rl_rollout_redeliver_s`` (publishing is idempotent, so a redelivery never duplicates).
    rl_rollout_time_limit_s: int = 900
    rl_rollout_redeliver_s: int = 1200
    rl_task_dir: Path = Path(".cstack/tasks")
    rl_max_tokens: int = 256
    rl_max_turns: int = 8
    #: Triggers, hints and the hint-KL settings; `cstack rl --feedback-config` sets it for
    #: its workers so rollouts and trainer read the same file.
    rl_feedback_config: Path = DEFAULT_FEEDBACK_FILE
    rl_metrics_port: int | None = None
    #: A cgroup v2 directory delegated to this worker (memory and pids enabled for its
    #: children): each sandboxed run gets a cgroup of its own under it. Unset: the harness
    #: bounds a run's totals by watching them (training/rl/agent/run_bounds.py).
    sandbox_cgroup: Path | None = None
    #: The reviewer of suspicious coding episodes (flagged, or earning within
    #: ``rl_review_fast_turns`` turns): any OpenAI-compatible API and model. Empty URL and
    #: key: the policy's own (the tiny model locally; point it at a strong model in
    #: production). ``rl_review`` false: no review.
    rl_review: bool = True
    rl_review_url: str = ""
    rl_review_model: str = "composer-2.5"
    rl_review_api_key: SecretStr = SecretStr("")
    rl_review_fast_turns: int = 2

    @field_validator("redis_url")
    @classmethod
    def _single_redis(cls, url: str) -> str:
        if url.split("://", 1)[0] in ("redis-cluster", "rediss-cluster"):
            raise ValueError(
                "names a Redis Cluster; training's Celery queues and trajectory stream need "
                "a single Redis (redis://...): give the training processes that one"
            )
        return url
