"""GRPO hyper-parameters; text feedback and its hint-KL settings are ``training.feedback``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from training.feedback import TextFeedbackConfig

Normalisation = Literal["token", "sequence"]


@dataclass(frozen=True)
class GRPOConfig:
    """Group-relative policy optimisation with a PPO-style clipped ratio."""

    group_size: int = 4
    clip_low: float = 0.2
    clip_high: float = 0.2
    normalisation: Normalisation = "token"
    scale_by_std: bool = True
    std_eps: float = 1e-6
    max_staleness: int = 2
    feedback: TextFeedbackConfig = field(default_factory=TextFeedbackConfig)
