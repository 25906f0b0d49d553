"""What a rollout task carries on the Celery queue."""

from __future__ import annotations

from pydantic import BaseModel


class RolloutRequest(BaseModel):
    """``rollout_id`` is the idempotency key: one accepted request, one trajectory."""

    rollout_id: str
    task_id: str
    environment: str
    policy_version: int
    seed: int = 0
