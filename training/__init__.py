"""Training: DeepSeek-V3 model, Muon, meshes, trainer, RL loop.

The public API below is imported lazily (PEP 562) so that ``import training.<sub>`` (the
CLI, the task builder) does not pay for importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ModelConfig": "training.model_config",
    "DeepseekV3Model": "training.model",
    "Muon": "training.muon",
    "MuonConfig": "training.muon",
    "build_optimizer": "training.muon",
    "NewtonSchulzConfig": "training.newton_schulz",
    "ParallelConfig": "training.mesh",
    "Trainer": "training.trainer",
    "TrainerConfig": "training.trainer_config",
    "LossFn": "training.losses",
    "LossTerms": "training.losses",
    "cross_entropy_loss": "training.losses",
    "token_logprobs": "training.losses",
    "StepStats": "training.trainer",
}

__all__ = [
    "DeepseekV3Model",
    "LossFn",
    "LossTerms",
    "ModelConfig",
    "Muon",
    "MuonConfig",
    "NewtonSchulzConfig",
    "ParallelConfig",
    "StepStats",
    "Trainer",
    "TrainerConfig",
    "build_optimizer",
    "cross_entropy_loss",
    "token_logprobs",
]

if TYPE_CHECKING:
    from training.losses import LossFn, LossTerms, cross_entropy_loss, token_logprobs
    from training.mesh import ParallelConfig
    from training.model import DeepseekV3Model
    from training.model_config import ModelConfig
    from training.muon import Muon, MuonConfig, build_optimizer
    from training.newton_schulz import NewtonSchulzConfig
    from training.trainer import StepStats, Trainer
    from training.trainer_config import TrainerConfig


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'training' has no attribute {name!r}")
    return getattr(import_module(module), name)
