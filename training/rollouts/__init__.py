"""Rollouts: Celery workers, environments, exactly-once trajectory publishing, version gate,
weight sync. Exports load lazily (PEP 562) so `cstack --help` stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "PolicyVersionGate": "training.rollouts.gate",
    "SyncTimeout": "training.rollouts.gate",
    "TrajectoryPublisher": "training.rollouts.publish",
    "RolloutRequest": "training.rollouts.request",
    "VllmWeightSync": "training.rollouts.weight_sync",
    "WeightSyncError": "training.rollouts.weight_sync",
}

__all__ = [
    "PolicyVersionGate",
    "RolloutRequest",
    "SyncTimeout",
    "TrajectoryPublisher",
    "VllmWeightSync",
    "WeightSyncError",
]

if TYPE_CHECKING:
    from training.rollouts.gate import PolicyVersionGate, SyncTimeout
    from training.rollouts.publish import TrajectoryPublisher
    from training.rollouts.request import RolloutRequest
    from training.rollouts.weight_sync import VllmWeightSync, WeightSyncError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'training.rollouts' has no attribute {name!r}")
    return getattr(import_module(module), name)
