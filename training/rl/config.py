"""RL configuration: GRPO hyper-parameters and targeted text feedback (triggers + hints).

Triggers and hints are data: a YAML file (``feedback.yaml`` next to this module is the
default) lists them, so adding a new failure pattern needs no code change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

DEFAULT_FEEDBACK_FILE = Path(__file__).with_name("feedback.yaml")

Normalisation = Literal["token", "sequence"]
KlNormalisation = Literal["token", "turn"]


class FeedbackConfigError(ValueError):
    """The feedback YAML is malformed; the message names the offending entry."""


@dataclass(frozen=True)
class Trigger:
    """When a turn deserves a hint. Every condition that is set must hold for one call.

    ``unknown_tool``: the turn called a tool that is not in the episode's tool list.
    ``tool_result_regex``: a tool result of the turn matches (searched, not anchored).
    ``completion_regex``: the turn's completion text matches.
    ``hint`` may use ``{tools}``: the comma-separated names of the available tools.
    """

    name: str
    hint: str
    unknown_tool: bool = False
    tool_result_regex: str | None = None
    completion_regex: str | None = None

    def __post_init__(self) -> None:
        if not (self.unknown_tool or self.tool_result_regex or self.completion_regex):
            raise FeedbackConfigError(f"trigger {self.name!r} has no condition")
        for pattern in (self.tool_result_regex, self.completion_regex):
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as err:
                    raise FeedbackConfigError(
                        f"trigger {self.name!r}: bad regex {pattern!r}: {err}"
                    ) from err


@dataclass(frozen=True)
class TextFeedbackConfig:
    """Hint KL: its own coefficient and normalisation, independent of the policy loss.

    ``hint_template`` wraps the hint as a chat message inserted right before the
    ``generation_prompt`` (the assistant header) at the end of the flagged turn's prompt.
    """

    enabled: bool = True
    kl_coef: float = 0.1
    kl_normalisation: KlNormalisation = "token"
    hint_template: str = "<|im_start|>system\n{hint}<|im_end|>\n"
    generation_prompt: str = "<|im_start|>assistant\n"
    triggers: tuple[Trigger, ...] = ()


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


def _trigger(entry: Any, index: int) -> Trigger:
    if not isinstance(entry, dict) or "name" not in entry or "hint" not in entry:
        raise FeedbackConfigError(f"triggers[{index}] needs at least 'name' and 'hint'")
    known = {"name", "hint", "unknown_tool", "tool_result_regex", "completion_regex"}
    unknown = set(entry) - known
    if unknown:
        raise FeedbackConfigError(f"triggers[{index}]: unknown keys {sorted(unknown)}")
    return Trigger(**entry)


def load_feedback_config(path: Path = DEFAULT_FEEDBACK_FILE) -> TextFeedbackConfig:
    """Read triggers, hints and the KL settings from YAML."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise FeedbackConfigError(f"cannot read feedback config {path}: {err}") from err
    if not isinstance(raw, dict):
        raise FeedbackConfigError(f"{path}: expected a mapping at the top level")
    triggers = tuple(_trigger(entry, i) for i, entry in enumerate(raw.pop("triggers", [])))
    known = {"enabled", "kl_coef", "kl_normalisation", "hint_template", "generation_prompt"}
    unknown = set(raw) - known
    if unknown:
        raise FeedbackConfigError(f"{path}: unknown keys {sorted(unknown)}")
    if raw.get("kl_normalisation", "token") not in ("token", "turn"):
        raise FeedbackConfigError(f"{path}: kl_normalisation must be 'token' or 'turn'")
    return TextFeedbackConfig(triggers=triggers, **raw)
