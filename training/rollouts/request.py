"""What a rollout task carries on the Celery queue."""

from __future__ import annotations

from pydantic import BaseModel


class RolloutRequest(BaseModel):
    """``rollout_id`` is the idempotency key: one accepted request, one trajectory."""

    rollout_id: str
    task_id: str
    environment: str
    policy_version: int
    #: vLLM's per-request sampling seed; None samples unseeded. Two runs that give the k-th
    #: rollout the same seed share their random numbers (common random numbers).
    seed: int | None = None
