"""The tiny checkpoint's reasoning parser, a vLLM plugin (``--reasoning-parser-plugin``).

The tiny chat template thinks the way Kimi K2.5 does (``<think>`` opened by the generation
prompt when the ``thinking`` kwarg is true) but, unlike K2.5, is off unless asked for. vLLM's
``kimi_k2`` parser assumes thinking when a request names no kwarg, so direct vLLM callers'
plain answers would come back as reasoning; its ``deepseek_v3`` parser has the tiny
template's default (thinking only with ``thinking``/``enable_thinking``) and splits on the
same markers. Two things it lacks, added here:

- Reasoning token counts (``usage.completion_tokens_details.reasoning_tokens``): vLLM's
  count is of the tokens between ``<think>`` and ``</think>`` *in the output*, so it is 0
  when the prompt opened ``<think>``. Here a thinking request's output is reasoning up to
  its first ``</think>``, as the streaming parser splits it (the gateway always streams).
- The markers whatever the request: vLLM builds its ``ReasoningConfig`` (the token ids
  its thinking budget forces) from a parser made without kwargs, which for ``deepseek_v3``
  is the no-thinking identity parser with no markers, so ``thinking_token_budget`` would
  be refused.

Production engines (Kimi K2.5's own template, which thinks by default) use ``kimi_k2``.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser
from vllm.reasoning.deepseek_v3_reasoning_parser import DeepSeekV3ReasoningParser

#: The ``--reasoning-parser`` name this module registers.
NAME = "composer_tiny"
THINK_START, THINK_END = "<think>", "</think>"


class TinyReasoningParser(DeepSeekV3ReasoningParser):
    @property
    def reasoning_start_str(self) -> str | None:
        return THINK_START

    @property
    def reasoning_end_str(self) -> str | None:
        return THINK_END

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        if not isinstance(self._parser, DeepSeekR1ReasoningParser):
            return 0  # not thinking: nothing is reasoning
        # Thinking requests have <think> opened by the prompt: reasoning runs to the first
        # </think> (or to the end). A <think> the model writes inside it opens nothing new
        # (vLLM's count would restart there and miss the tokens before it); the markers
        # themselves are not reasoning text.
        start, end = self._parser.start_token_id, self._parser.end_token_id
        count = 0
        for token in token_ids:
            if token == end:
                break
            if token != start:
                count += 1
        return count


ReasoningParserManager.register_module(NAME, module=TinyReasoningParser)
