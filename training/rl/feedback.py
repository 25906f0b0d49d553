"""Targeted text feedback: find the turns that deserve a hint and build hinted contexts.

Detection runs where the episode is known (the rollout worker) and is recorded in the
trajectory as ``FeedbackMark``s; the trainer turns each mark into a teacher context by
inserting the hint's tokens right before the flagged turn's assistant header.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from training.agent.record import FeedbackMark, Turn
from training.rl.config import TextFeedbackConfig, Trigger

Encode = Callable[[str], list[int]]


def _fires(trigger: Trigger, turn: Turn, tool_names: Sequence[str]) -> bool:
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
