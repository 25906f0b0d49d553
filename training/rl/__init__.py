"""RL objective: GRPO with targeted text feedback, and the trajectory consumer."""

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
from training.rl.losses import (
    PolicyLossStats,
    clipped_policy_loss,
    group_advantages,
    hint_kl_loss,
    token_logprobs,
)
from training.rl.step import Policy, RlLossStats, rl_loss
from training.rl.trainer_hook import grpo_loss_hook, trainer_batch

__all__ = [
    "DEFAULT_FEEDBACK_FILE",
    "ConsumerStats",
    "FeedbackConfigError",
    "GRPOConfig",
    "Policy",
    "PolicyLossStats",
    "RlLossStats",
    "TextFeedbackConfig",
    "TrajectoryConsumer",
    "TrajectoryGroup",
    "Trigger",
    "TurnBatch",
    "build_batch",
    "clipped_policy_loss",
    "completion_logits",
    "detect_feedback",
    "group_advantages",
    "grpo_loss_hook",
    "hint_kl_loss",
    "hinted_prompt",
    "load_feedback_config",
    "rl_loss",
    "token_logprobs",
    "trainer_batch",
]
