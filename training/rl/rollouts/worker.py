"""The rollout Celery app: one task runs one episode and publishes its trajectory.

Delivery is at-least-once (acks_late + reject_on_worker_lost: a worker killed mid-episode
leaves its message unacknowledged and the broker hands it out again); publishing is
exactly-once per rollout id (see publish.py). Together: no accepted rollout is lost and
none is duplicated.
"""

from __future__ import annotations

import logging
from functools import cache

import httpx
import openai
import redis
from celery import Celery
from celery.signals import worker_process_init
from prometheus_client import start_http_server

from training.rl.agent import EpisodeConfig, PolicyClient, SamplingConfig
from training.rl.feedback import load_feedback_config
from training.rl.monitor.review import ChatReviewer, ReviewConfig
from training.rl.rollouts.environments import (
    CodingEnvironment,
    DigitsEnvironment,
    Environment,
    ToolChoiceEnvironment,
)
from training.rl.rollouts.gate import PolicyVersionGate, SyncTimeout, gate_prefix
from training.rl.rollouts.metrics import (
    MONITOR_FLAGGED,
    MONITOR_REVIEWS,
    MONITOR_RULES,
    REWARD,
    ROLLOUTS,
)
from training.rl.rollouts.publish import TrajectoryPublisher
from training.rl.rollouts.request import RolloutRequest
from training.rl.work_queue import work_queue_app
from training.settings import TrainingSettings

logger = logging.getLogger(__name__)

TASK_NAME = "rollouts.run"
TRANSIENT = (
    openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError,
    openai.RateLimitError, httpx.TransportError, redis.ConnectionError, SyncTimeout,
)  # fmt: skip


def make_celery(settings: TrainingSettings) -> Celery:
    return work_queue_app(
        "cstack-rollouts", settings.redis_url, settings.rl_rollout_queue,
        redeliver_s=settings.rl_rollout_redeliver_s,
        task_time_limit=settings.rl_rollout_time_limit_s + 30,
        task_soft_time_limit=settings.rl_rollout_time_limit_s,
    )  # fmt: skip


settings = TrainingSettings()
celery_app = make_celery(settings)


@worker_process_init.connect
def _serve_metrics(**_: object) -> None:
    """Each worker process serves /metrics on its own port (base + process index)."""
    if settings.rl_metrics_port is not None:
        from billiard import current_process

        index = getattr(current_process(), "index", 0) or 0
        try:
            start_http_server(settings.rl_metrics_port + index)
        except OSError as err:  # a taken port must not stop rollouts
            logger.warning("no /metrics on port %s: %s", settings.rl_metrics_port + index, err)


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url)


@cache
def _policy() -> PolicyClient:
    sampling = SamplingConfig(max_tokens=settings.rl_max_tokens)
    return PolicyClient(
        settings.rl_policy_url, settings.rl_api_key.get_secret_value() or "none", sampling
    )


@cache
def _environments() -> dict[str, Environment]:
    feedback = load_feedback_config(settings.rl_feedback_config)
    episode = EpisodeConfig(
        max_turns=settings.rl_max_turns, wall_time_s=settings.rl_rollout_time_limit_s
    )
    coding = CodingEnvironment(settings.rl_task_dir, episode, feedback)
    if settings.rl_review:
        key = (
            settings.rl_review_api_key.get_secret_value() or settings.rl_api_key.get_secret_value()
        )
        url = settings.rl_review_url or settings.rl_policy_url
        coding.reviewer = ChatReviewer(
            url, key or "none", settings.rl_review_model, max_tokens=settings.rl_max_tokens
        )
        coding.reviewer_name = settings.rl_review_model
        coding.review = ReviewConfig(fast_turns=settings.rl_review_fast_turns)
    envs: list[Environment] = [
        coding,
        DigitsEnvironment(feedback),
        ToolChoiceEnvironment(feedback),
    ]
    return {env.name: env for env in envs}


def run_rollout_request(request: RolloutRequest) -> str:
    """Run (unless already published) and publish; returns the stream entry id."""
    publisher = TrajectoryPublisher(_redis(), settings.rl_trajectory_stream)
    existing = publisher.published_entry(request.rollout_id)
    if existing:
        logger.info("rollout %s already published as %s", request.rollout_id, existing)
        return existing
    environment = _environments().get(request.environment)
    if environment is None:
        raise ValueError(f"unknown environment {request.environment!r}")
    gate = PolicyVersionGate(_redis(), gate_prefix(settings.rl_trajectory_stream))
    policy = _policy().seeded(request.seed).styled(request.reasoning_effort, request.verbosity)
    trajectory = environment.run(request, policy, gate.turn)
    entry = publisher.publish(trajectory)
    env = trajectory.environment
    ROLLOUTS.labels(env=env).inc()
    REWARD.labels(env=env).observe(trajectory.reward)
    if trajectory.verdicts:
        MONITOR_FLAGGED.labels(env=env).inc()
    for verdict in trajectory.verdicts:
        MONITOR_RULES.labels(env=env, rule=verdict.rule).inc()
    if trajectory.review is not None:
        MONITOR_REVIEWS.labels(env=env, verdict=trajectory.review.verdict).inc()
    return entry


@celery_app.task(
    name=TASK_NAME,
    bind=True,
    autoretry_for=TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=60,
    max_retries=5,
)
def run_rollout(self: object, payload: dict[str, object]) -> str:
    return run_rollout_request(RolloutRequest.model_validate(payload))


def submit(request: RolloutRequest) -> None:
    """Enqueue one rollout (the trainer calls this with the current policy version)."""
    celery_app.send_task(TASK_NAME, args=[request.model_dump()], queue=settings.rl_rollout_queue)
