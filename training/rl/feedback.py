"""Targeted text feedback: which turns deserve a hint, and the hinted context for the teacher.

Triggers and hints are data: a YAML file (``feedback.yaml`` next to this module is the
default) lists them, so adding a new failure pattern needs no code change. Detection runs
where the episode is known (the rollout worker) and is recorded in the trajectory as
``FeedbackMark``s; the trainer turns each mark into a teacher context by inserting the
hint's tokens right before the flagged turn's assistant header.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from training.rl.trajectory import FeedbackMark, Turn

DEFAULT_FEEDBACK_FILE = Path(__file__).with_name("feedback.yaml")

KlNormalisation = Literal["token", "turn"]


class FeedbackConfigError(ValueError):
    """The feedback YAML is malformed; the message names the offending entry."""


@dataclass(frozen=True)
class Trigger:
    """When a turn deserves a hint. Every condition that is set must hold for one call.

    ``unknown_tool``: the turn called a tool that is not in the episode's tool list.
    ``tool_result_regex``: a tool result of the turn matches (searched, not anchored).
    ``completion_regex``: the turn's completion text matches.
    ``min_completion_tokens``: the turn's completion has at least this many tokens (its
    recorded ``completion_token_ids``): a communication-style condition, e.g. over-long.
    ``hint`` may use ``{tools}``: the comma-separated names of the available tools.
    """

    name: str
    hint: str
    unknown_tool: bool = False
    tool_result_regex: str | None = None
    completion_regex: str | None = None
    min_completion_tokens: int | None = None

    def __post_init__(self) -> None:
        if not (
            self.unknown_tool
            or self.tool_result_regex
            or self.completion_regex
            or self.min_completion_tokens is not None
        ):
            raise FeedbackConfigError(f"trigger {self.name!r} has no condition")
        limit = self.min_completion_tokens
        if limit is not None and (type(limit) is not int or limit < 1):  # bool is no int here
            raise FeedbackConfigError(
                f"trigger {self.name!r}: min_completion_tokens must be a positive integer, "
                f"got {limit!r}"
            )
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
    kl_coef: float = 3.0
    kl_normalisation: KlNormalisation = "token"
    hint_template: str = "<|im_start|>system\n{hint}<|im_end|>\n"
    generation_prompt: str = "<|im_start|>assistant\n"
    triggers: tuple[Trigger, ...] = ()


def _trigger(entry: Any, index: int) -> Trigger:
    if not isinstance(entry, dict) or "name" not in entry or "hint" not in entry:
        raise FeedbackConfigError(f"triggers[{index}] needs at least 'name' and 'hint'")
    known = {
        "name",
        "hint",
        "unknown_tool",
        "tool_result_regex",
        "completion_regex",
        "min_completion_tokens",
    }
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


Encode = Callable[[str], list[int]]


def _fires(trigger: Trigger, turn: Turn, tool_names: Sequence[str]) -> bool:
    limit = trigger.min_completion_tokens
    if limit is not None and len(turn.completion_token_ids) < limit:
        return False
    if trigger.completion_regex and not re.search(trigger.completion_regex, turn.completion_text):
        return False
    if not (trigger.unknown_tool or trigger.tool_result_regex):
        return True
    results = {result.call_id: result for result in turn.tool_results}
    for call in turn.tool_calls:
        if trigger.unknown_tool and call.name in tool_names:
            continue
        if trigger.tool_result_regex:
            result = results.get(call.call_id)
            if result is None or not re.search(trigger.tool_result_regex, result.content):
                continue
        return True
    return False


def detect_feedback(
    turns: Sequence[Turn], tool_names: Sequence[str], config: TextFeedbackConfig
) -> list[FeedbackMark]:
    """One mark per turn at most: the first trigger (in config order) that fires."""
    if not config.enabled:
        return []
    tools = ", ".join(tool_names)
    marks: list[FeedbackMark] = []
    for turn in turns:
        for trigger in config.triggers:
            if _fires(trigger, turn, tool_names):
                hint = trigger.hint.format(tools=tools)
                marks.append(FeedbackMark(turn_index=turn.index, trigger=trigger.name, hint=hint))
                break
    return marks


def hinted_prompt(
    prompt_token_ids: Sequence[int], hint: str, config: TextFeedbackConfig, encode: Encode
) -> list[int]:
    """The flagged turn's prompt with the hint message inserted before the assistant header.

    The completion tokens are scored after this prompt, so they keep their exact ids. If
    the prompt does not end with the generation prompt (a custom template) the hint goes
    at the very end, still before the completion.
    """
    hint_ids = encode(config.hint_template.format(hint=hint))
    header = encode(config.generation_prompt)
    prompt = list(prompt_token_ids)
    if header and prompt[-len(header) :] == header:
        cut = len(prompt) - len(header)
        return prompt[:cut] + hint_ids + prompt[cut:]
    return prompt + hint_ids
