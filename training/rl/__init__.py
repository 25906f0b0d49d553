"""RL objective: GRPO with targeted text feedback, the trainer hook, the trajectory consumer.

Exports load lazily (PEP 562) so that `cstack --help` and `training.rl.cli` do not import
torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "TurnBatch": "training.rl.batch",
    "build_batch": "training.rl.batch",
    "completion_logits": "training.rl.batch",
    "DEFAULT_FEEDBACK_FILE": "training.rl.config",
    "FeedbackConfigError": "training.rl.config",
    "GRPOConfig": "training.rl.config",
    "TextFeedbackConfig": "training.rl.config",
    "Trigger": "training.rl.config",
    "load_feedback_config": "training.rl.config",
    "ConsumerStats": "training.rl.consumer",
    "TrajectoryConsumer": "training.rl.consumer",
    "TrajectoryGroup": "training.rl.consumer",
    "detect_feedback": "training.rl.feedback",
    "hinted_prompt": "training.rl.feedback",
    "PolicyLossStats": "training.rl.losses",
    "clipped_policy_loss": "training.rl.losses",
    "clipped_surrogate": "training.rl.losses",
    "group_advantages": "training.rl.losses",
    "hint_kl_loss": "training.rl.losses",
    "kl_per_token": "training.rl.losses",
    "token_logprobs": "training.rl.losses",
    "Policy": "training.rl.step",
    "RlLossStats": "training.rl.step",
    "rl_loss": "training.rl.step",
    "grpo_loss_hook": "training.rl.trainer_hook",
    "trainer_batch": "training.rl.trainer_hook",
    "LoopConfig": "training.rl.loop",
    "RlLoop": "training.rl.loop",
    "StepReport": "training.rl.loop",
}

__all__ = [
    "DEFAULT_FEEDBACK_FILE",
    "ConsumerStats",
    "FeedbackConfigError",
    "GRPOConfig",
    "LoopConfig",
    "Policy",
    "PolicyLossStats",
    "RlLoop",
    "RlLossStats",
    "StepReport",
    "TextFeedbackConfig",
    "TrajectoryConsumer",
    "TrajectoryGroup",
    "Trigger",
    "TurnBatch",
    "build_batch",
    "clipped_policy_loss",
    "clipped_surrogate",
    "completion_logits",
    "detect_feedback",
    "group_advantages",
    "grpo_loss_hook",
    "hint_kl_loss",
    "hinted_prompt",
    "kl_per_token",
    "load_feedback_config",
    "rl_loss",
    "token_logprobs",
    "trainer_batch",
]

if TYPE_CHECKING:
    from training.rl.batch import TurnBatch, build_batch, completion_logits
    from training.rl.config import (
        DEFAULT_FEEDBACK_FILE,
        FeedbackConfigError,
        GRPOConfig,
        TextFeedbackConfig,
        Trigger,
        load_feedback_config,
    )
    from training.rl.consumer import ConsumerStats, TrajectoryConsumer, TrajectoryGroup
    from training.rl.feedback import detect_feedback, hinted_prompt
    from training.rl.loop import LoopConfig, RlLoop, StepReport
    from training.rl.losses import (
        PolicyLossStats,
        clipped_policy_loss,
        clipped_surrogate,
        group_advantages,
        hint_kl_loss,
        kl_per_token,
        token_logprobs,
    )
    from training.rl.step import Policy, RlLossStats, rl_loss
    from training.rl.trainer_hook import grpo_loss_hook, trainer_batch


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'training.rl' has no attribute {name!r}")
    return getattr(import_module(module), name)
