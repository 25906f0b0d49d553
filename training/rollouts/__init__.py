"""Rollouts: Celery workers, environments, exactly-once trajectory publishing, version gate."""

from training.rollouts.gate import PolicyVersionGate, SyncTimeout
from training.rollouts.publish import TrajectoryPublisher
from training.rollouts.request import RolloutRequest

__all__ = ["PolicyVersionGate", "RolloutRequest", "SyncTimeout", "TrajectoryPublisher"]
