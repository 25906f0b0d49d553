"""What a rollout task carries on the Celery queue."""

from __future__ import annotations

from pydantic import BaseModel

from serving.vocabulary import ReasoningEffort, Verbosity


class TaskStyle(BaseModel):
    """A task's communication style: the gateway's chat knobs; None leaves one unsent."""

    reasoning_effort: ReasoningEffort | None = None
    verbosity: Verbosity | None = None


class RolloutRequest(BaseModel):
    """``rollout_id`` is the idempotency key: one accepted request, one trajectory."""

    rollout_id: str
    task_id: str
    environment: str
    policy_version: int
    #: vLLM's per-request sampling seed; None samples unseeded. Two runs that give the k-th
    #: rollout the same seed share their random numbers (common random numbers).
    seed: int | None = None
    #: The task's communication style, sent on every chat request of the episode as the
    #: gateway's ``reasoning_effort`` and ``verbosity``; None: not sent.
    reasoning_effort: ReasoningEffort | None = None
    verbosity: Verbosity | None = None
